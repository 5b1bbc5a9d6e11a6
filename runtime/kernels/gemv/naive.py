"""Pure-torch GEMV with the same signature as kernel.gemv: dequantize (runtime.quant), matvec in fp64."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ...triton.weights import QWeight, dequantize_qweight


def gemv_naive(x: torch.Tensor, weights: Sequence[QWeight], out: torch.Tensor | None = None, *,
               norm_weight: torch.Tensor | None = None, eps: float = 1e-6, residual: torch.Tensor | None = None,
               conv_state: torch.Tensor | None = None, conv_weight: torch.Tensor | None = None,
               swiglu: bool = False, config=None, q8=None) -> torch.Tensor:
    xd = x.double()
    if norm_weight is not None:
        xd = xd * torch.rsqrt(xd.pow(2).mean() + eps) * norm_weight.double()
    ys = [dequantize_qweight(w).double() @ xd for w in weights]
    if swiglu:
        y = F.silu(ys[0]) * ys[1]
    else:
        if conv_state is not None:
            u = ys[0]
            window = torch.cat([conv_state.double(), u[None, :]], dim=0)  # [Kc, C], oldest first
            ys[0] = F.silu((window * conv_weight.double().t()).sum(0))
            conv_state.copy_(window[1:].to(conv_state.dtype))
        y = torch.cat(ys)
        if residual is not None:
            y = y + residual.double()
    y = y.float()
    if out is None:
        return y
    out.copy_(y)
    return out
