"""q/k RMSNorm + partial half-split RoPE for a prefill chunk, writing K (post-norm, post-RoPE) and V
into the bf16 cache and q into a bf16 buffer for flash attention. One program per (block of tokens, head): one
token on the GPU, 16 under the interpreter (rows_per_program)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..tl_utils import rows_per_program


@triton.jit
def _attn_prep_kernel(
    p_qg, p_k, p_v, p_qn, p_kn, p_cos, p_sin, p_qout, p_kc, p_vc, pos0, T, HQ, HKV,
    stride_qg, stride_k, stride_v, stride_qo_t, stride_cache_t, eps, DH: tl.constexpr, HALF: tl.constexpr,
    BT: tl.constexpr,
):
    i_h = tl.program_id(1)
    t64 = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)  # this program's tokens
    d = tl.arange(0, DH)
    j = tl.arange(0, HALF)
    rows = t64 < T
    md, mj = rows[:, None] & (d < DH)[None, :], rows[:, None] & (j < HALF)[None, :]  # full-shape masks
    is_q = i_h < HQ
    if is_q:
        p_src = p_qg + t64[:, None] * stride_qg + i_h * 2 * DH  # head i_h: [q | gate]
        p_w = p_qn
        p_dst = p_qout + t64[:, None] * stride_qo_t + i_h * DH
    else:
        h = i_h - HQ
        p_src = p_k + t64[:, None] * stride_k + h * DH
        p_w = p_kn
        p_dst = p_kc + (pos0 + t64[:, None]) * stride_cache_t + h * DH
        vrow = tl.load(p_v + t64[:, None] * stride_v + h * DH + d[None, :], mask=md)
        tl.store(p_vc + (pos0 + t64[:, None]) * stride_cache_t + h * DH + d[None, :], vrow.to(p_vc.dtype.element_ty),
                 mask=md)
    x = tl.load(p_src + d[None, :], mask=md, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / DH + eps)[:, None]
    y = x * rstd * tl.load(p_w + d)[None, :]
    tl.store(p_dst + d[None, :], y.to(p_dst.dtype.element_ty), mask=md & (d >= 2 * HALF)[None, :])
    x1 = tl.load(p_src + j[None, :], mask=mj, other=0.0).to(tl.float32) * rstd * tl.load(p_w + j)[None, :]
    x2 = tl.load(p_src + HALF + j[None, :], mask=mj, other=0.0).to(tl.float32) * rstd * tl.load(p_w + HALF + j)[None, :]
    c = tl.load(p_cos + t64[:, None] * HALF + j[None, :], mask=mj, other=0.0)
    s = tl.load(p_sin + t64[:, None] * HALF + j[None, :], mask=mj, other=0.0)
    tl.store(p_dst + j[None, :], (x1 * c - x2 * s).to(p_dst.dtype.element_ty), mask=mj)
    tl.store(p_dst + HALF + j[None, :], (x2 * c + x1 * s).to(p_dst.dtype.element_ty), mask=mj)


def attn_prep(
    qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos0: int, eps: float,
    *, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as attn_prep_naive."""
    if k_cache.dim() != 3 or k_cache.shape != v_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"caches must be contiguous [ctx, Hkv, Dh], got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    ctx, hkv, dh = k_cache.shape
    t = qg.shape[0]
    if qg.dim() != 2 or qg.shape[1] % (2 * dh) or qg.stride(1) != 1:
        raise ValueError(f"qg must be [T, 2·Hq·{dh}], got {tuple(qg.shape)}")
    hq = qg.shape[1] // (2 * dh)
    for name, x in (("k", k), ("v", v)):
        if x.shape != (t, hkv * dh) or x.stride(1) != 1:
            raise ValueError(f"{name} must be [{t}, {hkv * dh}], got {tuple(x.shape)}")
    half = cos.shape[1] if cos.dim() == 2 else -1
    if cos.shape != (t, half) or sin.shape != (t, half) or 2 * half > dh or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"cos/sin must be contiguous [{t}, rope_dims/2], got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if k.dtype != qg.dtype or v.dtype != qg.dtype or k_cache.dtype != torch.bfloat16 or v_cache.dtype != torch.bfloat16:
        raise ValueError(f"qg/k/v must share a dtype ({qg.dtype}, {k.dtype}, {v.dtype}) and the caches be bf16 ({k_cache.dtype})")
    if q_norm.shape != (dh,) or k_norm.shape != (dh,):
        raise ValueError(f"q_norm/k_norm must be [{dh}], got {tuple(q_norm.shape)}, {tuple(k_norm.shape)}")
    if not 0 <= pos0 <= ctx - t:
        raise ValueError(f"positions {pos0}..{pos0 + t - 1} do not fit a cache of {ctx} rows")
    if out is None:
        out = torch.empty(t, hq, dh, dtype=torch.bfloat16, device=qg.device)
    if out.shape != (t, hq, dh) or out.stride(2) != 1 or out.stride(1) != dh or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be [{t}, {hq}, {dh}], got {tuple(out.shape)}")
    if t == 0:
        return out
    bt = rows_per_program()
    _attn_prep_kernel[(triton.cdiv(t, bt), hq + hkv)](
        qg, k, v, q_norm, k_norm, cos, sin, out, k_cache, v_cache, pos0, t, hq, hkv,
        qg.stride(0), k.stride(0), v.stride(0), out.stride(0), k_cache.stride(0), eps, DH=dh, HALF=half, BT=bt,
        num_warps=2,
    )
    return out
