"""RMSNorm of the residual stream (§3.1): GGUF norm weights are already 1 + w."""
from __future__ import annotations

import torch


def rmsnorm_naive(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype=torch.bfloat16) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(out_dtype)
