"""Causal GQA flash attention for prefill: online softmax over the bf16 KV cache (which already holds
this chunk's keys), never materialising the score matrix; sigmoid output gate fused.

With Dh = 256 a [64, 256] fp32 accumulator plus the q operand overflows the registers on sm_90,
so the value columns may be split across programs (BV < Dh): each recomputes the scores (the
QKᵀ half of the work) and accumulates its BV columns — more FLOPs but no spills (checked with
ptxas: BM=BN=64, BV=128, 8 warps uses 195 registers and no stack; BV=256 spills ~1 KB).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..tl_utils import dot_flags, interpreting, mma_bf16


@triton.jit
def _flash_attn_kernel(
    p_q, p_qg, p_kc, p_vc, p_o, T, pos0, G, stride_q_t, stride_qg_t, stride_c_t, stride_o_t, scale_log2,
    DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr, DOT_BF16: tl.constexpr,
):
    i_m, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kv = i_h // G
    dv = i_v * BV + tl.arange(0, BV)  # the value columns this program accumulates
    rows = i_m * BM + tl.arange(0, BM)
    valid = rows < T
    d = tl.arange(0, DH)
    q = tl.load(p_q + rows[:, None].to(tl.int64) * stride_q_t + i_h * DH + d[None, :], mask=valid[:, None], other=0.0)
    q_pos = pos0 + rows
    m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, BV), dtype=tl.float32)
    hi = tl.minimum(pos0 + (i_m + 1) * BM, pos0 + T)  # one past the last key any row here may see
    n_full = (pos0 + i_m * BM) // BN  # key blocks entirely before the first query: no mask needed
    p_k = p_kc + i_kv * DH + d[None, :]
    p_v = p_vc + i_kv * DH + dv[None, :]
    for i_n in range(0, tl.cdiv(hi, BN)):
        keys = i_n * BN + tl.arange(0, BN)
        kmask = keys < hi
        k = tl.load(p_k + keys[:, None].to(tl.int64) * stride_c_t, mask=kmask[:, None], other=0.0)
        s = mma_bf16(q, tl.trans(k), tl.zeros((BM, BN), dtype=tl.float32), DOT_BF16) * scale_log2
        if i_n >= n_full:
            s = tl.where(keys[None, :] <= q_pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(p_v + keys[:, None].to(tl.int64) * stride_c_t, mask=kmask[:, None], other=0.0)
        acc = mma_bf16(p, v, acc * alpha[:, None], DOT_BF16)
        m_i = m_new
    gate = tl.load(p_qg + rows[:, None].to(tl.int64) * stride_qg_t + i_h * 2 * DH + DH + dv[None, :],
                   mask=valid[:, None], other=0.0).to(tl.float32)
    o = acc / l_i[:, None] * tl.sigmoid(gate)
    tl.store(p_o + rows[:, None].to(tl.int64) * stride_o_t + i_h * DH + dv[None, :], o.to(p_o.dtype.element_ty),
             mask=valid[:, None])


def flash_attn(q: torch.Tensor, qg: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos0: int, *,
               out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """Same contract as flash_attn_naive."""
    if q.dim() != 3 or q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        raise ValueError(f"q must be [T, Hq, Dh] with contiguous heads, got {tuple(q.shape)}")
    t, hq, dh = q.shape
    if k_cache.dim() != 3 or k_cache.shape != v_cache.shape or k_cache.shape[2] != dh or k_cache.stride() != v_cache.stride():
        raise ValueError(f"caches must be [ctx, Hkv, {dh}] alike, got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    ctx, hkv, _ = k_cache.shape
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    if qg.shape != (t, 2 * hq * dh) or qg.stride(1) != 1:
        raise ValueError(f"qg must be [{t}, {2 * hq * dh}], got {tuple(qg.shape)}")
    if not 0 <= pos0 <= ctx - t:
        raise ValueError(f"positions {pos0}..{pos0 + t - 1} do not fit a cache of {ctx} rows")
    if out is None:
        out = torch.empty(t, hq * dh, dtype=torch.bfloat16, device=q.device)
    if out.shape != (t, hq * dh) or out.stride(1) != 1:
        raise ValueError(f"out must be [{t}, {hq * dh}], got {tuple(out.shape)}")
    if t == 0:
        return out
    default = dict(BM=16, BN=16, BV=dh, num_warps=1) if interpreting() else dict(BM=64, BN=64, BV=min(dh, 128), num_warps=8, num_stages=2)
    cfg = dict(config or default)
    bm, bv = cfg.pop("BM"), cfg.setdefault("BV", dh)
    if dh % bv:
        raise ValueError(f"BV={bv} must divide Dh={dh}")
    _flash_attn_kernel[(triton.cdiv(t, bm), hq, dh // bv)](
        q, qg, k_cache, v_cache, out, t, pos0, hq // hkv, q.stride(0), qg.stride(0), k_cache.stride(0), out.stride(0),
        dh**-0.5 * 1.4426950408889634, DH=dh, BM=bm, DOT_BF16=dot_flags()["DOT_BF16"], **cfg,
    )
    return out
