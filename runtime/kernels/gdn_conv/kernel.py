"""Token-parallel causal conv + SiLU for Gated DeltaNet prefill.

Every (token block, channel block) program reads its Kc-tap window straight from the chunk's
projections, or from the carried conv state for the first Kc-1 tokens; the new state (last
Kc-1 raw inputs) is written after the kernel so no program reads a half-updated state.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..tl_utils import interpreting


@triton.jit
def _gdn_conv_kernel(p_x, p_state, p_w, p_y, T, C, stride_x, stride_y,
                     KW: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    i_t, i_c = tl.program_id(0), tl.program_id(1)
    rows = i_t * BT + tl.arange(0, BT)
    cols = i_c * BC + tl.arange(0, BC)
    mask_c = cols < C
    acc = tl.zeros((BT, BC), dtype=tl.float32)
    for i in tl.static_range(KW):
        src = rows - (KW - 1) + i  # token read by tap i; < 0 means it lives in the state
        from_x = (src >= 0) & (src < T)
        b_x = tl.load(p_x + src[:, None].to(tl.int64) * stride_x + cols[None, :],
                      mask=from_x[:, None] & mask_c[None, :], other=0.0).to(tl.float32)
        srow = src + (KW - 1)
        from_s = (src < 0) & (srow >= 0)
        b_s = tl.load(p_state + srow[:, None] * C + cols[None, :], mask=from_s[:, None] & mask_c[None, :], other=0.0)
        b_w = tl.load(p_w + cols * KW + i, mask=mask_c, other=0.0)
        acc += (b_x + b_s) * b_w[None, :]
    y = acc * tl.sigmoid(acc)
    tl.store(p_y + rows[:, None].to(tl.int64) * stride_y + cols[None, :], y,
             mask=(rows < T)[:, None] & mask_c[None, :])


def gdn_conv(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as gdn_conv_naive: returns SiLU(conv) fp32 [T, C], updates `state` in place."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, C] with unit column stride, got {tuple(x.shape)}")
    t, c = x.shape
    if weight.dim() != 2 or weight.shape[0] != c or weight.dtype != torch.float32 or not weight.is_contiguous():
        raise ValueError(f"conv weight must be contiguous fp32 [{c}, Kc], got {weight.dtype} {tuple(weight.shape)}")
    kw = weight.shape[1]
    if state.shape != (kw - 1, c) or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"conv state must be contiguous fp32 [{kw - 1}, {c}], got {state.dtype} {tuple(state.shape)}")
    if out is None:
        out = torch.empty(t, c, dtype=torch.float32, device=x.device)
    if out.shape != (t, c) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"out must be fp32 [{t}, {c}], got {out.dtype} {tuple(out.shape)}")
    if t == 0:
        return out
    bt, bc = (16, 64) if interpreting() else (32, 128)
    grid = (triton.cdiv(t, bt), triton.cdiv(c, bc))
    _gdn_conv_kernel[grid](x, state, weight, out, t, c, x.stride(0), out.stride(0), KW=kw, BT=bt, BC=bc,
                           num_warps=4)
    # new state = the last Kc-1 raw inputs of [state; x] (tiny: Kc-1 rows)
    keep = kw - 1
    if t >= keep:
        state.copy_(x[t - keep:])
    else:
        state.copy_(torch.cat([state[t:], x.to(state.dtype)], dim=0))
    return out
