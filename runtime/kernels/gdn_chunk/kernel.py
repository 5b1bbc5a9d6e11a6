"""Chunked gated delta rule for prefill (architecture reference §5.8), chunk 64, fp32 state.

Three kernels:
  _gdn_prep_kernel  one program per (chunk, value head), all chunks in parallel: L2-norm k,
                    gates g/β, Γ = cumsum g, A = β k kᵀ ⊙ exp(Γr−Γs) (strictly lower),
                    T = (I+A)⁻¹ by forward substitution in fp32, U = T diag(β) V,
                    W = T diag(βγ) K, Kd = diag(exp(Γ_n−Γ)) K → scratch.
  _gdn_scan_kernel  one program per (value head, block of value columns), sequential over
                    chunks, only the state recurrence: stores S entering each chunk,
                    Δ = U − W S (over U), S ← γ_n S + Kdᵀ Δ; the final S is written back in place.
  _gdn_out_kernel   one program per (chunk, value head, value block), in parallel:
                    O = diag(γ) Q S_in + ((Q Kᵀ) ⊙ M) Δ.
Value columns are independent in every step after T, so splitting dv across programs is exact.
Masks are applied to exponent arguments (−inf), never after exponentiating.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..tl_utils import dot_flags, gdn_log_decay, interpreting, mma_f32

CHUNK = 64


@triton.jit
def _l2norm_rows(x):
    return x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]


@triton.jit
def _gdn_prep_kernel(
    p_u, p_alpha, p_b, p_ssm_a, p_dt, p_wout, p_uout, p_kdout, p_gam, T, stride_u, stride_ab, HK, HV,
    DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, F32_PREC: tl.constexpr, TRIM: tl.constexpr = False,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_kh = i_h % HK  # GGUF tiled head mapping (§5.5)
    r = tl.arange(0, BT)
    rows = i_c * BT + r
    valid = rows < T
    # gates (§5.4), zero for padded rows: g = 0, β = 0
    a = tl.load(p_alpha + rows * stride_ab + i_h, mask=valid, other=0.0).to(tl.float32)
    b = tl.load(p_b + rows * stride_ab + i_h, mask=valid, other=0.0).to(tl.float32)
    g = tl.where(valid, gdn_log_decay(a, tl.load(p_dt + i_h), tl.load(p_ssm_a + i_h)), 0.0)
    beta = tl.where(valid, tl.sigmoid(b), 0.0)
    gam = tl.cumsum(g, axis=0)

    ck = HK * DK
    p_rows = p_u + rows[:, None].to(tl.int64) * stride_u
    k = tl.load(p_rows + ck + i_kh * DK + tl.arange(0, DK)[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    k = _l2norm_rows(k)
    v = tl.load(p_rows + 2 * ck + i_h * DV + tl.arange(0, DV)[None, :], mask=valid[:, None], other=0.0).to(tl.float32)

    strict = r[:, None] > r[None, :]
    decay = tl.exp(tl.where(strict, gam[:, None] - gam[None, :], float("-inf")))
    kk = mma_f32(k, tl.trans(k), tl.zeros((BT, BT), dtype=tl.float32), F32_PREC)
    A = beta[:, None] * kk * decay

    # T = (I + A)^-1, row by row: T_i = e_i - Σ_{s<i} A_is T_s (A_is = 0 for s >= i). Rows past the chunk's last
    # token have β = 0, so zero rows of A: their rows of T stay e_i and no valid row reads them. TRIM (the CPU
    # interpreter, which pays per iteration) stops at the last valid row; the GPU keeps the static bound.
    Tm = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    n_rows = BT
    if TRIM:
        n_rows = tl.minimum(T - i_c * BT, BT)
    for i in range(1, n_rows):
        a_i = tl.sum(tl.where(r[:, None] == i, A, 0.0), axis=0)
        x_i = tl.sum(a_i[:, None] * Tm, axis=0)
        Tm = tl.where(r[:, None] == i, Tm - x_i[None, :], Tm)

    U = mma_f32(Tm, beta[:, None] * v, tl.zeros((BT, DV), dtype=tl.float32), F32_PREC)
    W = mma_f32(Tm, (beta * tl.exp(gam))[:, None] * k, tl.zeros((BT, DK), dtype=tl.float32), F32_PREC)
    last = tl.minimum(T - i_c * BT, BT) - 1
    gam_n = tl.sum(tl.where(r == last, gam, 0.0), axis=0)
    kd = k * tl.where(valid, tl.exp(gam_n - gam), 0.0)[:, None]
    base = i_h.to(tl.int64) * T + rows
    tl.store(p_uout + base[:, None] * DV + tl.arange(0, DV)[None, :], U, mask=valid[:, None])
    tl.store(p_wout + base[:, None] * DK + tl.arange(0, DK)[None, :], W, mask=valid[:, None])
    tl.store(p_kdout + base[:, None] * DK + tl.arange(0, DK)[None, :], kd, mask=valid[:, None])
    tl.store(p_gam + base, gam, mask=valid)


@triton.jit
def _gdn_scan_kernel(
    p_wbuf, p_ubuf, p_kdbuf, p_gam, p_state, p_h, T, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    BT: tl.constexpr, F32_PREC: tl.constexpr,
):
    i_h, i_v = tl.program_id(0), tl.program_id(1)
    r = tl.arange(0, BT)
    ok = tl.arange(0, DK)
    ov = i_v * BV + tl.arange(0, BV)
    p_s = p_state + i_h.to(tl.int64) * DK * DV + ok[:, None] * DV + ov[None, :]
    S = tl.load(p_s)  # [DK, BV] fp32
    n_chunks = tl.cdiv(T, BT)
    for c in range(0, n_chunks):
        # the state entering chunk c, for the parallel output kernel
        tl.store(p_h + ((i_h.to(tl.int64) * n_chunks + c) * DK + ok[:, None]) * DV + ov[None, :], S)
        rows = c * BT + r
        valid = rows < T
        base = i_h.to(tl.int64) * T + rows
        w = tl.load(p_wbuf + base[:, None] * DK + ok[None, :], mask=valid[:, None], other=0.0)
        p_d = p_ubuf + base[:, None] * DV + ov[None, :]
        u = tl.load(p_d, mask=valid[:, None], other=0.0)
        delta = u - mma_f32(w, S, tl.zeros((BT, BV), dtype=tl.float32), F32_PREC)
        tl.store(p_d, delta, mask=valid[:, None])  # Δ replaces U
        kd = tl.load(p_kdbuf + base[:, None] * DK + ok[None, :], mask=valid[:, None], other=0.0)
        last = tl.minimum(T - c * BT, BT) - 1
        gam_n = tl.load(p_gam + i_h.to(tl.int64) * T + c * BT + last)
        S = mma_f32(tl.trans(kd), delta, S * tl.exp(gam_n), F32_PREC)
    tl.store(p_s, S)


@triton.jit
def _gdn_out_kernel(
    p_u, p_dbuf, p_gam, p_h, p_o, T, stride_u, stride_o, HK, scale,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, F32_PREC: tl.constexpr,
):
    i_c, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h % HK
    r = tl.arange(0, BT)
    ok = tl.arange(0, DK)
    ov = i_v * BV + tl.arange(0, BV)
    rows = i_c * BT + r
    valid = rows < T
    n_chunks = tl.cdiv(T, BT)
    base = i_h.to(tl.int64) * T + rows
    gam = tl.load(p_gam + base, mask=valid, other=0.0)
    last = tl.minimum(T - i_c * BT, BT) - 1
    gam = tl.where(valid, gam, tl.sum(tl.where(r == last, gam, 0.0), axis=0))  # padded rows: flat, decays <= 1
    p_rows = p_u + rows[:, None].to(tl.int64) * stride_u
    q = _l2norm_rows(tl.load(p_rows + i_kh * DK + ok[None, :], mask=valid[:, None], other=0.0).to(tl.float32)) * scale
    k = _l2norm_rows(tl.load(p_rows + HK * DK + i_kh * DK + ok[None, :], mask=valid[:, None], other=0.0).to(tl.float32))
    S = tl.load(p_h + ((i_h.to(tl.int64) * n_chunks + i_c) * DK + ok[:, None]) * DV + ov[None, :])
    delta = tl.load(p_dbuf + base[:, None] * DV + ov[None, :], mask=valid[:, None], other=0.0)
    o = mma_f32(q * tl.exp(gam)[:, None], S, tl.zeros((BT, BV), dtype=tl.float32), F32_PREC)
    qk = mma_f32(q, tl.trans(k), tl.zeros((BT, BT), dtype=tl.float32), F32_PREC)
    causal = r[:, None] >= r[None, :]
    qk = qk * tl.exp(tl.where(causal, gam[:, None] - gam[None, :], float("-inf")))
    o = mma_f32(qk, delta, o, F32_PREC)
    tl.store(p_o + rows[:, None].to(tl.int64) * stride_o + i_h * DV + ov[None, :], o, mask=valid[:, None])


class GDNScratch:
    """W, U/Δ, Kd [Hv, T, d], Γ [Hv, T] and the per-chunk entering states [Hv, T/64, dk, dv] for one
    prefill chunk; sized by the chunk, reused across layers."""

    def __init__(self, n_tokens: int, n_v_head: int, head_dim: int, device):
        f32 = dict(dtype=torch.float32, device=device)
        self.capacity = n_tokens
        self.w = torch.empty(n_v_head * n_tokens * head_dim, **f32)
        self.u = torch.empty(n_v_head * n_tokens * head_dim, **f32)
        self.kd = torch.empty(n_v_head * n_tokens * head_dim, **f32)
        self.gam = torch.empty(n_v_head * n_tokens, **f32)
        self.h = torch.empty(n_v_head * triton.cdiv(n_tokens, CHUNK) * head_dim * head_dim, **f32)

    @staticmethod
    def nbytes(n_tokens: int, n_v_head: int, head_dim: int) -> int:
        chunks = -(-n_tokens // CHUNK)
        return 4 * n_v_head * (n_tokens * (3 * head_dim + 1) + chunks * head_dim * head_dim)


SMEM_LIMIT = 232448  # bytes of shared memory one block may use on sm_90 (H200)


def scan_config(hv: int, dv: int) -> dict:
    """Launch config of _gdn_scan_kernel. num_stages=1: the chunk loop must not be software-pipelined —
    Triton's default 3 stages buffer W, Kd and U of three chunks in shared memory (245760 B at
    BV=32 > the 232448 B limit on H200; 57344 B with one stage, no spills; see
    bench/profiling/prefill_compile_check.py)."""
    if interpreting():
        return dict(BV=int(os.environ.get("TOKENGATE_GDN_SCAN_BV", dv)), num_warps=1, num_stages=1)
    # BV=16 computed wrong states after the first chunk on the H200 (0.8B: top-1 0.125 with 128-token chunks,
    # an illegal access at 32k) while BV=32 passed the fp32-reference check at every shape we ran; the
    # interpreter was right at both, so 16 is never chosen on the GPU. The variable overrides, for bisecting.
    bv = int(os.environ.get("TOKENGATE_GDN_SCAN_BV", 32))
    return dict(BV=bv, num_warps=8, num_stages=1)


def prep_config() -> dict:
    return dict(num_warps=1 if interpreting() else 8, num_stages=1)


def out_config(dv: int) -> dict:
    return dict(BV=dv if interpreting() else 64, num_warps=1 if interpreting() else 8, num_stages=1)


def gdn_chunk(
    u: torch.Tensor, alpha: torch.Tensor, b: torch.Tensor, ssm_a: torch.Tensor, dt_bias: torch.Tensor,
    state: torch.Tensor, *, n_k_head: int, out: torch.Tensor | None = None, scratch: GDNScratch | None = None,
) -> torch.Tensor:
    """Same contract as gdn_chunk_naive: o [T, Hv, dv] fp32; `state` [Hv, dk, dv] updated in place."""
    if state.dim() != 3 or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"state must be contiguous fp32 [Hv, dk, dv], got {state.dtype} {tuple(state.shape)}")
    hv, dk, dv = state.shape
    if hv % n_k_head:
        raise ValueError(f"Hv={hv} is not a multiple of Hk={n_k_head}")
    t = u.shape[0]
    cc = 2 * n_k_head * dk + hv * dv
    if u.dim() != 2 or u.shape[1] != cc or u.stride(1) != 1:
        raise ValueError(f"u must be [T, {cc}] (q|k|v), got {tuple(u.shape)}")
    if alpha.shape != (t, hv) or b.shape != (t, hv) or alpha.stride() != b.stride() or alpha.stride(1) != 1:
        raise ValueError(f"alpha and b must be [{t}, {hv}] with equal strides, got {tuple(alpha.shape)}, {tuple(b.shape)}")
    if ssm_a.shape != (hv,) or dt_bias.shape != (hv,):
        raise ValueError(f"ssm_a and dt_bias must be [{hv}], got {tuple(ssm_a.shape)}, {tuple(dt_bias.shape)}")
    if dk != dv or dk & (dk - 1) or dk < 16:
        raise ValueError(f"head dims dk={dk}, dv={dv}: need dk == dv, a power of two >= 16")
    if out is None:
        out = torch.empty(t, hv, dv, dtype=torch.float32, device=u.device)
    if out.shape != (t, hv, dv) or out.dtype != torch.float32 or out.stride(2) != 1 or out.stride(1) != dv:
        raise ValueError(f"out must be fp32 [{t}, {hv}, {dv}], got {out.dtype} {tuple(out.shape)}")
    if t == 0:
        return out
    if scratch is None or scratch.capacity < t or scratch.w.numel() < hv * t * dk or scratch.h.numel() < hv * triton.cdiv(t, CHUNK) * dk * dv:
        scratch = GDNScratch(t, hv, dk, u.device)
    flags = dot_flags()
    _gdn_prep_kernel[(triton.cdiv(t, CHUNK), hv)](
        u, alpha, b, ssm_a, dt_bias, scratch.w, scratch.u, scratch.kd, scratch.gam, t, u.stride(0), alpha.stride(0),
        n_k_head, hv, DK=dk, DV=dv, BT=CHUNK, F32_PREC=flags["F32_PREC"], TRIM=interpreting(), **prep_config(),
    )
    scfg = scan_config(hv, dv)
    _gdn_scan_kernel[(hv, dv // scfg["BV"])](
        scratch.w, scratch.u, scratch.kd, scratch.gam, state, scratch.h, t,
        DK=dk, DV=dv, BT=CHUNK, F32_PREC=flags["F32_PREC"], **scfg,
    )
    ocfg = out_config(dv)
    _gdn_out_kernel[(triton.cdiv(t, CHUNK), hv, dv // ocfg["BV"])](
        u, scratch.u, scratch.gam, scratch.h, out, t, u.stride(0), out.stride(0), n_k_head, dk**-0.5,
        DK=dk, DV=dv, BT=CHUNK, F32_PREC=flags["F32_PREC"], **ocfg,
    )
    return out
