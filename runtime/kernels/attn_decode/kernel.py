"""Gated full attention for one decode token: prep (q/k RMSNorm + partial RoPE + KV append),
split-K flash-decoding partials over the cache, and a combine that applies the sigmoid gate.

The position is read from a device int32 scalar, so a CUDA graph of these launches is
position-free; the split count is fixed (grid constant) and each split's chunk length is
derived from the position on the device. Input: the attention projection buffer
[q/gate interleaved per head (2*Hq*Dh) | k (Hkv*Dh) | v (Hkv*Dh)].
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..pdl import gdc_launch_dependents, gdc_wait, pdl_launch

LOG2E = 1.4426950408889634


@triton.jit
def _attn_prep_kernel(p_proj, p_qn, p_kn, p_pos, p_q, p_kc, p_vc, n_head, n_kv_head, eps, log2_base,
                      DH: tl.constexpr, ROPE: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # everything below reads the q/k/v projection the previous kernel wrote
        gdc_launch_dependents()
        gdc_wait()
    i_h = tl.program_id(0)
    pos = tl.load(p_pos)
    d = tl.arange(0, DH)
    half: tl.constexpr = ROPE // 2
    partner = tl.where(d < half, d + half, tl.where(d < ROPE, d - half, d))
    sign = tl.where(d < half, -1.0, 1.0)
    is_q = i_h < n_head
    i_kv = i_h - n_head
    src = tl.where(is_q, i_h * 2 * DH, 2 * n_head * DH + i_kv * DH)
    p_nw = tl.where(is_q, p_qn, p_kn)
    x = tl.load(p_proj + src + d)
    w = tl.load(p_nw + d)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / DH + eps)
    xn = x * r * w
    xp = tl.load(p_proj + src + partner) * r * tl.load(p_nw + partner)
    inv_freq = tl.exp2(-((d % half).to(tl.float32) * 2.0 / ROPE) * log2_base)
    ang = pos.to(tl.float32) * inv_freq
    rot = xn * tl.cos(ang) + sign * xp * tl.sin(ang)
    y = tl.where(d < ROPE, rot, xn)
    if is_q:
        tl.store(p_q + i_h * DH + d, y)
    else:
        row = pos.to(tl.int64) * n_kv_head + i_kv
        tl.store(p_kc + row * DH + d, y.to(p_kc.dtype.element_ty))
        v = tl.load(p_proj + 2 * n_head * DH + n_kv_head * DH + i_kv * DH + d)
        tl.store(p_vc + row * DH + d, v.to(p_vc.dtype.element_ty))


@triton.jit
def _attn_partial_kernel(p_q, p_kc, p_vc, p_pos, p_m, p_l, p_acc, n_kv_head, qk_scale_log2,
                         G: tl.constexpr, GP: tl.constexpr, DH: tl.constexpr, BT: tl.constexpr,
                         NSPLIT: tl.constexpr, LOWP: tl.constexpr = False, WIDEN: tl.constexpr = False,
                         PDL: tl.constexpr = False):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    i_kv = tl.program_id(0)
    i_s = tl.program_id(1)
    n_tok = tl.load(p_pos) + 1  # the current token is already appended
    chunk = tl.cdiv(tl.cdiv(n_tok, NSPLIT), BT) * BT
    start = i_s * chunk
    end = tl.minimum(start + chunk, n_tok)
    g = tl.arange(0, GP)
    d = tl.arange(0, DH)
    gmask = g < G
    q = tl.load(p_q + (i_kv * G + g)[:, None] * DH + d[None, :], mask=gmask[:, None], other=0.0)
    q = q * qk_scale_log2  # scores come out in log2 units
    # LOWP: both dots on the cache dtype's tensor cores (fp32 accumulate), K/V never widened. WIDEN
    # (the interpreter, whose bf16 dot multiplies raw bits in Triton 3.9): the same rounded
    # operands, widened to fp32 for the dot, which is exact for bf16 products.
    if LOWP:
        q = q.to(p_kc.dtype.element_ty)
    if WIDEN or not LOWP:
        q = q.to(tl.float32)  # q.dtype is the dots' operand type from here on
    m = tl.full([GP], float("-inf"), tl.float32)
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DH], tl.float32)
    t = tl.arange(0, BT)
    for t0 in range(start, end, BT):
        tt = t0 + t
        tmask = tt < end
        rows = tt.to(tl.int64) * n_kv_head + i_kv
        k = tl.load(p_kc + rows[:, None] * DH + d[None, :], mask=tmask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)))  # [GP, BT]; fp32 operands are tf32 on the GPU
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(p_vc + rows[:, None] * DH + d[None, :], mask=tmask[:, None], other=0.0)
        if LOWP:
            p = p.to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
        m = m_new
    heads = i_kv * G + g
    tl.store(p_m + heads * NSPLIT + i_s, m, mask=gmask)
    tl.store(p_l + heads * NSPLIT + i_s, l, mask=gmask)
    # an empty split (short context: most of them) writes only m = -inf, l = 0; the combine skips its acc
    tl.store(p_acc + (heads[:, None] * NSPLIT + i_s) * DH + d[None, :], acc, mask=(gmask & (g * 0 + start < end))[:, None])


@triton.jit
def _attn_combine_kernel(p_m, p_l, p_acc, p_proj, p_out, DH: tl.constexpr, NSPLIT: tl.constexpr,
                         SB: tl.constexpr, DB: tl.constexpr, PDL: tl.constexpr = False):
    """Merge the splits of head i_h over the head-dim slice i_d (DB wide), SB splits at a time (a
    [NSPLIT, DH] tile at once spilled at NSPLIT=128: 255 registers + spills at the 0.8B shape),
    then apply the output gate."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    i_h = tl.program_id(0)
    d = tl.program_id(1) * DB + tl.arange(0, DB)
    m_all = tl.max(tl.load(p_m + i_h * NSPLIT + tl.arange(0, NSPLIT)), axis=0)
    o = tl.zeros([DB], tl.float32)
    den = tl.zeros([1], tl.float32)
    for s0 in tl.static_range(0, NSPLIT, SB):
        s = s0 + tl.arange(0, SB)
        m = tl.load(p_m + i_h * NSPLIT + s)
        l = tl.load(p_l + i_h * NSPLIT + s)
        valid = m > float("-inf")
        w = tl.where(valid, tl.exp2(m - m_all), 0.0)  # empty splits weigh nothing (and their acc is not read)
        acc = tl.load(p_acc + (i_h * NSPLIT + s)[:, None] * DH + d[None, :], mask=valid[:, None], other=0.0)
        o += tl.sum(acc * w[:, None], axis=0)
        den += tl.sum(l * w, axis=0)
    z = tl.load(p_proj + i_h * 2 * DH + DH + d)  # the head's output-gate logits
    tl.store(p_out + i_h * DH + d, o / den / (1.0 + tl.exp(-z)))


@dataclass(frozen=True)
class AttnConfig:
    """Launch choices of the decode attention (the split count lives in AttnWorkspace: it sizes buffers).

    The defaults are the fastest correct choice at 0.8B, 4B and 9B on the H200 at depths 0, 4096 and
    16384 together (bench/profiling/attn_sweep.py, receipt attn-sweep-20261201T094039Z.json: 16k at 0.8B went
    from 30.0 to 19.0 us per layer, depth 0 from 11.1 to 7.3)."""

    block_t: int = 32  # cache rows per step of a split's loop
    num_warps: int | None = None  # None: 4 on the GPU, 1 under the interpreter
    num_stages: int | None = 3  # software-pipelining depth of the partial kernel (None: Triton's)
    lowp: bool = True  # q and p in the cache dtype for the two dots (fp32 accumulate)
    combine_block_d: int | None = 64  # head-dim slice per combine program (None: the whole head)

    def __post_init__(self):
        for name in ("block_t", "combine_block_d"):
            v = getattr(self, name)
            if v is not None and (v < 16 or triton.next_power_of_2(v) != v):
                raise ValueError(f"AttnConfig.{name} must be a power of two >= 16, got {v}")


class AttnWorkspace:
    """Preallocated per-engine buffers for the decode attention (shared by all attention layers)."""

    def __init__(self, n_head: int, head_dim: int, n_split: int, device):
        self.n_split = n_split
        self.q = torch.zeros(n_head * head_dim, device=device)
        self.m = torch.zeros(n_head * n_split, device=device)
        self.l = torch.zeros(n_head * n_split, device=device)
        self.acc = torch.zeros(n_head * n_split * head_dim, device=device)


def default_n_split(max_context: int, n_sm: int = 132) -> int:
    """Splits (a power of two): one per 256 tokens of context, at most about half the SMs. Measured
    on the H200 (132 SMs, bench/profiling/attn_sweep.py): 64 splits beat 32, 128 and 256 at 16k for Hkv = 2
    and 4 (the combine's cost grows with the split count, and 64 x Hkv = 2 fills one wave)."""
    cap = 1 << max(0, (max(1, n_sm // 2)).bit_length() - 1)  # largest power of two <= n_sm / 2
    return max(1, min(cap, triton.next_power_of_2(triton.cdiv(max_context, 256))))


def attention_decode(proj, q_norm_w, k_norm_w, pos, k_cache, v_cache, out, ws: AttnWorkspace, *, n_head: int,
                     n_kv_head: int, head_dim: int, rope_dims: int, rope_base: float, eps: float = 1e-6,
                     config: AttnConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """Gated attention output [Hq*Dh] for the token at device position `pos` (int32 [1]); appends K/V."""
    dh = head_dim
    cfg = config or AttnConfig()
    need = 2 * n_head * dh + 2 * n_kv_head * dh
    if proj.shape != (need,) or proj.dtype != torch.float32:
        raise ValueError(f"attention_decode: proj must be fp32 [{need}], got {tuple(proj.shape)} {proj.dtype}")
    if n_head % n_kv_head:
        raise ValueError(f"attention_decode: Hq={n_head} not a multiple of Hkv={n_kv_head}")
    if k_cache.shape[1:] != (n_kv_head, dh) or v_cache.shape != k_cache.shape:
        raise ValueError(f"attention_decode: caches must be [ctx, {n_kv_head}, {dh}], got {tuple(k_cache.shape)}")
    if out.shape != (n_head * dh,) or pos.dtype != torch.int32 or pos.numel() != 1:
        raise ValueError(f"attention_decode: out must be [{n_head * dh}] and pos an int32 scalar tensor")
    if triton.next_power_of_2(dh) != dh or rope_dims % 2 or rope_dims > dh:
        raise ValueError(f"attention_decode: head_dim {dh} must be a power of two, rope_dims {rope_dims} even <= it")
    db = min(cfg.combine_block_d or dh, dh)
    g = n_head // n_kv_head
    cpu = proj.device.type == "cpu"
    nw = cfg.num_warps or (1 if cpu else 4)
    stages = {} if cfg.num_stages is None else {"num_stages": cfg.num_stages}
    pdl, pkw = pdl_launch(pdl, proj.device, "attention_decode")
    _attn_prep_kernel[(n_head + n_kv_head,)](proj, q_norm_w, k_norm_w, pos, ws.q, k_cache, v_cache, n_head, n_kv_head,
                                             float(eps), math.log2(rope_base), DH=dh, ROPE=rope_dims, PDL=pdl,
                                             num_warps=nw, **pkw)
    _attn_partial_kernel[(n_kv_head, ws.n_split)](
        ws.q, k_cache, v_cache, pos, ws.m, ws.l, ws.acc, n_kv_head, LOG2E / math.sqrt(dh),
        G=g, GP=max(16, triton.next_power_of_2(g)), DH=dh, BT=cfg.block_t, NSPLIT=ws.n_split, LOWP=cfg.lowp, WIDEN=cpu,
        PDL=pdl, num_warps=nw, **stages, **pkw)
    _attn_combine_kernel[(n_head, dh // db)](ws.m, ws.l, ws.acc, proj, out, DH=dh, NSPLIT=ws.n_split,
                                             SB=min(ws.n_split, max(16, 4096 // db)), DB=db, PDL=pdl, num_warps=nw, **pkw)
    return out
