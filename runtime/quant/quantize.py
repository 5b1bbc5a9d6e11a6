"""Vectorised torch quantizers that write exact GGUF block bytes.

The algorithms are llama.cpp's reference ones (ggml-quants.c, no importance matrix):
`quantize_row_q8_0_ref`; Q4_K/Q5_K: `make_qkx2_quants` (iterative scale/min search per
32-weight sub-block, then 6-bit super-block scales); Q6_K: `make_qx_quants` (weighted
scale search per 16-weight sub-block, then int8 super-block scales).

Every block is processed at once as a tensor op; only the search steps and the
32 (or 16) terms of each per-sub-block sum are Python loops. Sums are accumulated
element by element in C order, so the float32 results — and hence the chosen quants —
match llama-quantize's (checked against the fixture's Q4_K_M file).
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from ..gguf.types import BLOCK, GGMLType

QK_K = 256
GROUP_MAX_EPS = 1e-15
_F32 = np.float32

# Rows are quantized in chunks of about this many weights to bound temporary memory
# (~20 fp32 temporaries of the chunk's size); GPUs get bigger chunks to amortise launches.
CPU_CHUNK_WEIGHTS = 1 << 22
CUDA_CHUNK_WEIGHTS = 1 << 26


# -- helpers that reproduce C float semantics -------------------------------------------------
def _seq_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over dim 0, first to last, one float32 add at a time (as a C loop does)."""
    acc = t[0].clone()
    for i in range(1, t.shape[0]):
        acc.add_(t[i])
    return acc


def _div(num, den: torch.Tensor) -> torch.Tensor:
    """IEEE float32 num / den, as C computes it.

    torch evaluates `scalar / t` as `reciprocal(t) * scalar`, and CUDA evaluates
    `t / scalar` as `t * (1 / scalar)`; both can differ from C by one ulp, so every
    division goes through a same-device tensor.  It is filled on the device (torch.full)
    rather than copied from the host (torch.tensor), which would synchronise the stream at
    every division: ~30 times per Q4_K call.
    """
    if not isinstance(num, torch.Tensor):
        num = torch.full((), float(num), dtype=torch.float32, device=den.device)
    if not isinstance(den, torch.Tensor):
        den = torch.full((), float(den), dtype=torch.float32, device=num.device)
    return torch.div(num, den)


def _sqrtf(t: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 sqrt of t >= 0, as C's sqrtf.

    torch's vectorised CPU sqrt is off by one ulp on ~0.6% of inputs (CUDA's is exact), which
    flips near-tie scale choices in make_qkx2_quants (seen in Q5_K). The estimate is corrected
    against the squares of its neighbouring midpoints, which are exact in float64.
    """
    s = torch.sqrt(t)
    inf = torch.full_like(s, float("inf"))
    lo, hi = torch.nextafter(s, -inf), torch.nextafter(s, inf)
    v, sd = t.double(), s.double()
    lo_mid, hi_mid = (sd + lo.double()) * 0.5, (sd + hi.double()) * 0.5
    s = torch.where((lo >= 0) & (v < lo_mid * lo_mid), lo, s)
    return torch.where(v > hi_mid * hi_mid, hi, s)


def _nearest_int(t: torch.Tensor) -> torch.Tensor:
    """llama.cpp nearest_int: round half to even (the 1.5*2^23 trick), kept as float."""
    return torch.round(t)


def _roundf(t: torch.Tensor) -> torch.Tensor:
    """C roundf: half away from zero (exact, no `x + 0.5` double rounding)."""
    a = t.abs()
    fl = torch.floor(a)
    return torch.sign(t) * (fl + torch.floor(2 * (a - fl)))


def _fp16_bytes(t: torch.Tensor) -> torch.Tensor:
    """[n] fp32 -> [n, 2] uint8, little-endian IEEE half (round to nearest even)."""
    return t.reshape(-1, 1).to(torch.float16).view(torch.uint8)


def _fp16_value(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float16).float()


def _first_argmax(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Index of the first maximum along `dim` (C's `if (a > best)` scan keeps the first)."""
    m = t.amax(dim=dim, keepdim=True)
    shape = [1] * t.dim()
    shape[dim] = t.shape[dim]
    idx = torch.arange(t.shape[dim], device=t.device).view(shape).expand_as(t)
    return torch.where(t == m, idx, t.shape[dim]).amin(dim=dim)


# -- Q8_0 -------------------------------------------------------------------------------------
def _quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    b = x.view(-1, 32)
    d = _div(b.abs().amax(dim=1), 127)
    inv = torch.where(d == 0, torch.zeros_like(d), _div(1, d))
    q = _roundf(b * inv[:, None]).to(torch.int8).view(torch.uint8)
    return torch.cat([_fp16_bytes(d), q], dim=1)


# -- Q4_K / Q5_K ------------------------------------------------------------------------------
def _make_qkx2_quants(x, w, nmax: int, rmin: float, rdelta: float, nstep: int):
    """make_qkx2_quants for every sub-block at once; x, w are [n, S] (column s = sub-block s).

    The element-major layout makes each per-sub-block sum a run of contiguous row adds and
    every per-sub-block broadcast a contiguous one. Returns (L [n, S] float codes,
    scale [S], the_min [S]) with value = scale*L - the_min.
    """
    mn = x.amin(dim=0).clamp_max(0)  # `if (min > 0) min = 0`
    mx = x.amax(dim=0)
    sum_w = _seq_sum(w)
    sum_x = _seq_sum(w * x)
    degenerate = mx == mn

    def codes(iscale, mn):
        return (x - mn).mul_(iscale).round_().clamp_(0, nmax)  # nearest_int(iscale*(x - min))

    def weighted_error(scale, L, mn):
        diff = (L * scale).add_(mn).sub_(x)
        return _seq_sum(diff.mul_(diff).mul_(w))

    iscale = _div(nmax, mx - mn)
    scale = _div(1, iscale)
    L = codes(iscale, mn)
    best = weighted_error(scale, L, mn)
    for step in range(nstep + 1):
        factor = _F32(rmin) + _F32(rdelta) * _F32(step) + _F32(nmax)
        Laux = codes(_div(factor, mx - mn), mn)
        wl = w * Laux
        sum_l = _seq_sum(wl)
        sum_xl = _seq_sum(wl * x)
        sum_l2 = _seq_sum(wl.mul_(Laux))
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = _div(sum_w * sum_xl - sum_x * sum_l, D)
        this_min = _div(sum_l2 * sum_x - sum_l * sum_xl, D)
        clip = this_min > 0
        this_min = torch.where(clip, torch.zeros_like(this_min), this_min)
        this_scale = torch.where(clip, _div(sum_xl, sum_l2), this_scale)
        err = weighted_error(this_scale, Laux, this_min)
        better = (D > 0) & (err < best) & ~degenerate
        L = torch.where(better, Laux, L)
        best = torch.where(better, err, best)
        scale = torch.where(better, this_scale, scale)
        mn = torch.where(better, this_min, mn)
    L = torch.where(degenerate, torch.zeros_like(L), L)
    scale = torch.where(degenerate, torch.zeros_like(scale), scale)
    return L, scale, -mn


def _to_uint6(v: torch.Tensor) -> torch.Tensor:
    """`uint8_t l = nearest_int(v); l = MIN(63, l)` including C's modulo-256 wrap."""
    return (_nearest_int(v).to(torch.int64) & 255).clamp_max(63)


def _pack_k_scales(ls: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """Eight 6-bit scales and mins [nb, 8] (int64) -> the 12 scale bytes of Q4_K/Q5_K."""
    lo = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    mid = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    hi = (ls[:, 4:] & 15) | ((lm[:, 4:] & 15) << 4)
    return torch.cat([lo, mid, hi], dim=1).to(torch.uint8)


def _k_quant_codes(x: torch.Tensor, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Shared Q4_K/Q5_K part: (codes L [nb, 256] int64, block head [nb, 16] = d, dmin, 12 scale bytes)."""
    nb = x.shape[0]
    sub = x.reshape(nb * 8, 32).T.contiguous()  # [32, sub-blocks]
    av_x = _sqrtf(_div(_seq_sum(sub * sub), 32))
    weights = sub.abs().add_(av_x)
    L, scales, mins = _make_qkx2_quants(sub, weights, nmax, rmin, rdelta, nstep)
    scales, mins, L = scales.view(nb, 8), mins.view(nb, 8), L.T.reshape(nb, 8, 32)

    zero = torch.zeros((), device=x.device)
    max_scale = torch.where(scales.amax(dim=1) > 0, scales.amax(dim=1), zero)
    max_min = torch.where(mins.amax(dim=1) > 0, mins.amax(dim=1), zero)
    inv_scale = torch.where(max_scale > 0, _div(63, max_scale), zero)
    inv_min = torch.where(max_min > 0, _div(63, max_min), zero)
    ls = _to_uint6(inv_scale[:, None] * scales)
    lm = _to_uint6(inv_min[:, None] * mins)
    d_all, dmin_all = _div(max_scale, 63), _div(max_min, 63)

    d = _fp16_value(d_all)[:, None] * ls.float()
    dm = _fp16_value(dmin_all)[:, None] * lm.float()
    sub_x = x.view(nb, 8, 32)
    requant = _nearest_int(_div(sub_x + dm[..., None], d[..., None])).clamp(0, nmax)
    L = torch.where((d != 0)[..., None], requant, L).to(torch.int64).view(nb, QK_K)
    head = torch.cat([_fp16_bytes(d_all), _fp16_bytes(dmin_all), _pack_k_scales(ls, lm)], dim=1)
    return L, head


def _quantize_q4_k(x: torch.Tensor) -> torch.Tensor:
    b = x.view(-1, QK_K)
    L, head = _k_quant_codes(b, 15, -1.0, 0.1, 20)
    g = L.view(-1, 4, 2, 32)  # four groups of 64: low nibble = first 32, high = next 32
    qs = (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(-1, 128).to(torch.uint8)
    return torch.cat([head, qs], dim=1)


def _quantize_q5_k(x: torch.Tensor) -> torch.Tensor:
    b = x.view(-1, QK_K)
    L, head = _k_quant_codes(b, 31, -0.5, 0.1, 15)
    sub = L.view(-1, 8, 32)  # sub-block j's 5th bits go to bit j of qh[l]
    shifts = torch.arange(8, device=x.device).view(1, 8, 1)
    qh = ((sub >> 4) << shifts).sum(dim=1).to(torch.uint8)
    low = (sub & 15).view(-1, 4, 2, 32)
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128).to(torch.uint8)
    return torch.cat([head, qh, qs], dim=1)


# -- Q6_K -------------------------------------------------------------------------------------
def _make_qx_quants_rmse1(x: torch.Tensor, nmax: int):
    """make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL) for every sub-block at once.

    x is [n, S] (column s = sub-block s). Returns (L [n, S] float codes in 0..2*nmax-1, scale [S]).
    """
    ax = x.abs()
    imax = _first_argmax(ax, dim=0)
    amax = ax.gather(0, imax[None])[0]
    xmax = x.gather(0, imax[None])[0]
    zero = amax < GROUP_MAX_EPS
    w = x * x
    wx = w * x

    def codes_and_sums(iscale):
        l = (x * iscale).round_().clamp_(-nmax, nmax - 1)  # nearest_int(iscale*x), clipped
        wl = w * l
        return l, _seq_sum(wx * l), _seq_sum(wl.mul_(l))

    l, sumlx, suml2 = codes_and_sums(_div(-nmax, xmax))
    L = l + nmax
    scale = torch.where(suml2 != 0, _div(sumlx, suml2), torch.zeros_like(suml2))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = _div(-(_F32(nmax) + _F32(0.1) * _F32(step)), xmax)
        l, sumlx, suml2 = codes_and_sums(iscale)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = torch.where(better, l.add_(nmax), L)
        scale = torch.where(better, _div(sumlx, suml2), scale)
        best = torch.where(better, scale * sumlx, best)
    L = torch.where(zero, torch.zeros_like(L), L)
    scale = torch.where(zero, torch.zeros_like(scale), scale)
    return L, scale


def _quantize_q6_k(x: torch.Tensor) -> torch.Tensor:
    b = x.view(-1, QK_K)
    nb = b.shape[0]
    L, scales = _make_qx_quants_rmse1(b.reshape(nb * 16, 16).T.contiguous(), 32)
    L, scales = L.T.reshape(nb, 16, 16), scales.view(nb, 16)

    imax = _first_argmax(scales.abs())
    max_scale = scales.gather(1, imax[:, None])[:, 0]
    empty = max_scale.abs() < GROUP_MAX_EPS
    iscale = _div(-128, max_scale)
    d_all = _div(1, iscale)
    sc = _nearest_int(iscale[:, None] * scales).clamp_max(127)
    d = _fp16_value(d_all)[:, None] * sc
    requant = _nearest_int(_div(b.view(nb, 16, 16), d[..., None])).clamp(-32, 31) + 32
    L = torch.where((d != 0)[..., None], requant, L).to(torch.int64).view(nb, 2, 4, 32)

    # half h: ql[64h + l] = q(l) | q(l+64) << 4, ql[64h + 32 + l] = q(l+32) | q(l+96) << 4
    ql = torch.cat([(L[:, :, 0] & 15) | ((L[:, :, 2] & 15) << 4), (L[:, :, 1] & 15) | ((L[:, :, 3] & 15) << 4)], dim=2)
    shifts = torch.tensor([0, 2, 4, 6], device=x.device).view(1, 1, 4, 1)
    qh = ((L >> 4) << shifts).sum(dim=2)
    out = torch.cat(
        [
            ql.reshape(nb, 128).to(torch.uint8),
            qh.reshape(nb, 64).to(torch.uint8),
            sc.to(torch.int8).view(torch.uint8),
            _fp16_bytes(d_all),
        ],
        dim=1,
    )
    return torch.where(empty[:, None], torch.zeros_like(out), out)  # llama.cpp memsets empty blocks


# -- passthrough types ------------------------------------------------------------------------
def _to_f32(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8).view(x.shape[0], -1)


def _to_f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).contiguous().view(torch.uint8).view(x.shape[0], -1)


def _to_bf16(x: torch.Tensor) -> torch.Tensor:
    """ggml_compute_fp32_to_bf16: round to nearest even, NaNs forced quiet."""
    n = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    is_nan = (n & 0x7FFFFFFF) > 0x7F800000
    rounded = (n + (0x7FFF + ((n >> 16) & 1))) >> 16
    quiet = ((n & 0xFFFF0000) | (64 << 16)) >> 16
    h = torch.where(is_nan, quiet, rounded) & 0xFFFF
    return torch.stack([h & 255, h >> 8], dim=-1).to(torch.uint8).view(x.shape[0], -1)


_QUANTIZERS = {
    GGMLType.F32: _to_f32,
    GGMLType.F16: _to_f16,
    GGMLType.BF16: _to_bf16,
    GGMLType.Q8_0: _quantize_q8_0,
    GGMLType.Q4_K: _quantize_q4_k,
    GGMLType.Q5_K: _quantize_q5_k,
    GGMLType.Q6_K: _quantize_q6_k,
}


@contextmanager
def _cpu_threads(n: int | None):
    """Temporarily cap torch's intra-op CPU threads (None: leave as is)."""
    before = torch.get_num_threads()
    if n is None or n >= before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def quantize(
    x: torch.Tensor, ggml_type, *, chunk_weights: int | None = None, cpu_threads: int | None = 1
) -> torch.Tensor:
    """Quantize fp32 `x` [..., cols] row by row into GGUF block bytes, uint8 [..., bytes_per_row].

    Runs on x's device. On CPU it runs with `cpu_threads` intra-op threads (default 1): the
    search is thousands of small ops, and on a busy machine thread hand-offs cost far more
    than they save (measured 5-10x slower with 2 threads on a loaded 2-core box).
    Raises ValueError when cols is not a multiple of the block size.
    """
    gtype = GGMLType(int(ggml_type))
    if gtype not in _QUANTIZERS:
        raise ValueError(f"no quantizer for ggml type {gtype.name}")
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("quantize expects a torch tensor with at least one dimension")
    if x.dtype != torch.float32:
        raise ValueError(f"quantize expects float32 input, got {x.dtype}")
    per_block, block_bytes = BLOCK[gtype]
    cols = x.shape[-1]
    if cols == 0 or cols % per_block:
        raise ValueError(f"row length {cols} is not a multiple of the {gtype.name} block size {per_block}")
    lead = tuple(x.shape[:-1])
    rows = x.reshape(-1, cols).contiguous()
    if gtype not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        n_bad = int((~torch.isfinite(rows)).sum())
        if n_bad:
            raise ValueError(f"cannot quantize to {gtype.name}: input has {n_bad} non-finite values (nan/inf)")
    row_bytes = cols // per_block * block_bytes
    out = torch.empty((rows.shape[0], row_bytes), dtype=torch.uint8, device=x.device)
    if chunk_weights is None:
        chunk_weights = CUDA_CHUNK_WEIGHTS if x.is_cuda else CPU_CHUNK_WEIGHTS
    step = max(1, chunk_weights // cols)
    fn = _QUANTIZERS[gtype]
    with _cpu_threads(None if x.is_cuda else cpu_threads):
        for r in range(0, rows.shape[0], step):
            chunk = rows[r : r + step]
            out[r : r + chunk.shape[0]] = fn(chunk).view(chunk.shape[0], row_bytes)
    return out.view(*lead, row_bytes)
