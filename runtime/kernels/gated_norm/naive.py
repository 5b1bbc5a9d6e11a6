"""GDN output: per-head RMSNorm (weight used as is) ⊙ SiLU(z) (§5.7)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_norm_naive(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """o [T, Hv, dv] fp32, z [T, Hv*dv] -> bf16 [T, Hv*dv] = RMSNorm_dv(o) · w · SiLU(z)."""
    t, hv, dv = o.shape
    of = o.float()
    y = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y * F.silu(z.float().reshape(t, hv, dv))).reshape(t, hv * dv).to(torch.bfloat16)
