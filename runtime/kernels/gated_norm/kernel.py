"""Gated RMSNorm ⊙ SiLU(z) over each GDN value head, writing the bf16 input of the out-projection."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gated_norm_kernel(p_o, p_z, p_w, p_y, T, HV, stride_o, stride_z, stride_y, eps,
                       DV: tl.constexpr, BT: tl.constexpr):
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    rows = i_t * BT + tl.arange(0, BT)
    cols = tl.arange(0, DV)
    valid = (rows < T)[:, None]
    r64 = rows[:, None].to(tl.int64)
    o = tl.load(p_o + r64 * stride_o + i_h * DV + cols[None, :], mask=valid, other=0.0).to(tl.float32)
    z = tl.load(p_z + r64 * stride_z + i_h * DV + cols[None, :], mask=valid, other=0.0).to(tl.float32)
    w = tl.load(p_w + cols)
    y = o * tl.rsqrt(tl.sum(o * o, axis=1) / DV + eps)[:, None] * w[None, :] * (z * tl.sigmoid(z))
    tl.store(p_y + r64 * stride_y + i_h * DV + cols[None, :], y.to(p_y.dtype.element_ty), mask=valid)


def gated_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as gated_norm_naive."""
    if o.dim() != 3 or o.stride(2) != 1 or o.stride(1) != o.shape[2]:
        raise ValueError(f"o must be [T, Hv, dv] with contiguous heads, got {tuple(o.shape)}")
    t, hv, dv = o.shape
    if z.shape != (t, hv * dv) or z.stride(1) != 1:
        raise ValueError(f"z must be [{t}, {hv * dv}], got {tuple(z.shape)}")
    if weight.shape != (dv,) or weight.dtype != torch.float32:
        raise ValueError(f"weight must be fp32 [{dv}], got {weight.dtype} {tuple(weight.shape)}")
    if out is None:
        out = torch.empty(t, hv * dv, dtype=torch.bfloat16, device=o.device)
    if out.shape != (t, hv * dv) or out.stride(1) != 1:
        raise ValueError(f"out must be [{t}, {hv * dv}], got {tuple(out.shape)}")
    if t == 0:
        return out
    bt = 16
    _gated_norm_kernel[(triton.cdiv(t, bt), hv)](o, z, weight, out, t, hv, o.stride(0), z.stride(0), out.stride(0), eps,
                                                DV=dv, BT=bt, num_warps=4)
    return out
