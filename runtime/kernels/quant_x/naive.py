"""Pure-torch twin of quantize_x, and the dequantized vector the dp4a GEMV multiplies by."""
from __future__ import annotations

import torch

from .kernel import QBLOCK, Q8Vector


def quantize_x_naive(x: torch.Tensor, out: Q8Vector, norm_weight: torch.Tensor | None = None,
                     eps: float = 1e-6) -> Q8Vector:
    K = x.shape[0]
    xe = x if norm_weight is None else x * norm_weight
    blocks = xe.reshape(-1, QBLOCK)
    amax = blocks.abs().amax(1)
    inv = torch.where(amax > 0, 127.0 / amax.clamp_min(1e-30), torch.zeros_like(amax))
    v = blocks * inv[:, None]
    q = torch.where(v >= 0, torch.floor(v + 0.5), -torch.floor(0.5 - v))
    d = amax / 127.0
    out.q[:K] = q.reshape(-1).to(torch.int8)
    s_a, s_b = q[:, :16].sum(1), q[:, 16:].sum(1)
    out.ds[: K // QBLOCK, 0] = d
    out.ds[: K // QBLOCK, 1] = d * (s_a + s_b)
    out.ds[: K // QBLOCK, 2] = d * s_a
    out.ds[: K // QBLOCK, 3] = d * s_b
    out.rstd[0] = torch.rsqrt(x.double().pow(2).mean() + eps).float() if norm_weight is not None else 1.0
    return out


def dequantize_q8(q8: Q8Vector, K: int) -> torch.Tensor:
    """The fp32 vector q * d that the int8 blocks stand for (the first K elements)."""
    return (q8.q[:K].float().reshape(-1, QBLOCK) * q8.ds[: K // QBLOCK, :1]).reshape(-1)
