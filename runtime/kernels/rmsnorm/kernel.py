"""Row RMSNorm: fp32 residual rows -> normalised rows (bf16 GEMM input by default), statistics in fp32."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..tl_utils import rows_per_program


@triton.jit
def _rmsnorm_kernel(p_x, p_w, p_y, T, D, stride_x, stride_y, eps, BT: tl.constexpr, BD: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    cols = tl.arange(0, BD)
    mask = (rows < T)[:, None] & (cols < D)[None, :]
    x = tl.load(p_x + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(p_w + cols, mask=cols < D, other=0.0)
    y = x * tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None] * w[None, :]
    tl.store(p_y + rows[:, None] * stride_y + cols[None, :], y.to(p_y.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None,
            out_dtype=torch.bfloat16) -> torch.Tensor:
    """Same contract as rmsnorm_naive; x [T, D] -> [T, D]."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, D] with unit column stride, got {tuple(x.shape)}")
    t, d = x.shape
    if weight.shape != (d,) or weight.dtype != torch.float32:
        raise ValueError(f"weight must be fp32 [{d}], got {weight.dtype} {tuple(weight.shape)}")
    if out is None:
        out = torch.empty(t, d, dtype=out_dtype, device=x.device)
    if out.shape != (t, d) or out.stride(1) != 1:
        raise ValueError(f"out must be [{t}, {d}], got {tuple(out.shape)}")
    if t == 0:
        return out
    bd, bt = triton.next_power_of_2(d), rows_per_program()
    _rmsnorm_kernel[(triton.cdiv(t, bt),)](x, weight, out, t, d, x.stride(0), out.stride(0), eps, BT=bt, BD=bd,
                                           num_warps=min(16, max(1, bd // 256)))
    return out
