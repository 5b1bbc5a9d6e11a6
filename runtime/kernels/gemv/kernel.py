"""Batch-1 GEMV over GGUF blocks: y = W x for up to four matrices sharing one input, one launch.

Each program owns BN consecutive rows of one matrix ("segment") and walks the whole K axis,
BB super-blocks per step, loading the block bytes as they sit in the file and unpacking
nibbles/scales in registers; accumulation is fp32. Because every program reads all of x,
RMSNorm of x folds in for free (x*w summed, sum of squares alongside, rstd applied at the end).

Epilogues (flags): residual add (out = res + Wx; res may alias out), causal conv + SiLU with
conv-state shift on segment 0 (GDN qkv: each program owns its channels, so no race),
SwiGLU over segments 0/1 (out = silu(W0 x) * (W1 x)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import triton
import triton.language as tl

from ...gguf import GGMLType
from ...triton.weights import QWeight

# qtype codes inside the kernel
T_F32, T_F16, T_BF16, T_Q8_0, T_Q4_K, T_Q5_K, T_Q6_K = 0, 1, 2, 3, 4, 5, 6
QCODE = {
    GGMLType.F32: T_F32,
    GGMLType.F16: T_F16,
    GGMLType.BF16: T_BF16,
    GGMLType.Q8_0: T_Q8_0,
    GGMLType.Q4_K: T_Q4_K,
    GGMLType.Q5_K: T_Q5_K,
    GGMLType.Q6_K: T_Q6_K,
}
# elements per inner step of the K loop for one BB unit
STEP_ELEMS = {T_F32: 256, T_F16: 256, T_BF16: 256, T_Q8_0: 32, T_Q4_K: 256, T_Q5_K: 256, T_Q6_K: 256}

EPI_NONE, EPI_RESIDUAL, EPI_CONV = 0, 1, 2


@triton.jit
def _x_pair(p_x, p_nw, offs, NORM: tl.constexpr):
    """x at element offsets, and the value to multiply weights with (x * norm weight if NORM)."""
    x = tl.load(p_x + offs)
    if NORM:
        return x, x * tl.load(p_nw + offs)
    return x, x


@triton.jit
def _k4_scale_min(p_w, base, j):
    """6-bit scale and min of sub-block j (Q4_K/Q5_K packing) for blocks starting at byte `base`."""
    p_s = p_w + base + 4
    a = tl.load(p_s + j[None, :]).to(tl.int32)  # s[j]
    b = tl.load(p_s + j[None, :] + 4).to(tl.int32)  # s[j+4]
    c = tl.load(p_s + tl.where(j >= 4, j - 4, j)[None, :]).to(tl.int32)  # s[j-4] (j >= 4)
    low = (j < 4)[None, :]
    sc = tl.where(low, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _dot_rows(p_w, row_bytes, rows, p_x, p_nw, K, QT: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
              NORM: tl.constexpr):
    """(W[rows] . x_eff) [BN] fp32 and the sum of squares of x over K (for a fused RMSNorm)."""
    acc = tl.zeros([BN], dtype=tl.float32)
    ss = tl.zeros([1], dtype=tl.float32)
    if QT == 4 or QT == 5:  # Q4_K (144 B) / Q5_K (176 B): 8 sub-blocks of 32, as 4 groups of lo/hi nibbles
        BPB = 144 + 32 * (QT - 4)  # block bytes
        QS = 16 + 32 * (QT - 4)  # offset of qs in the block
        p_h = p_w.to(tl.pointer_type(tl.float16))
        m = tl.arange(0, BB * 4)
        c = m % 4
        li = tl.arange(0, 32)
        for b0 in range(0, K // 256, BB):
            blk = b0 + m // 4  # [BB*4]
            base = rows[:, None] * row_bytes + blk[None, :] * BPB  # [BN, BB*4] block start bytes
            q = tl.load(p_w + base[:, :, None] + QS + (c * 32)[None, :, None] + li[None, None, :]).to(tl.int32)
            xo = (blk * 256 + c * 64)[:, None] + li[None, :]  # [BB*4, 32]
            x_lo, xe_lo = _x_pair(p_x, p_nw, xo, NORM)
            x_hi, xe_hi = _x_pair(p_x, p_nw, xo + 32, NORM)
            if NORM:
                ss += tl.sum(tl.sum(x_lo * x_lo + x_hi * x_hi, axis=1), axis=0)
            q_lo = q & 15
            q_hi = q >> 4
            if QT == 5:
                qh = tl.load(p_w + base[:, :, None] + 16 + li[None, None, :]).to(tl.int32)
                q_lo += ((qh >> (2 * c)[None, :, None]) & 1) << 4
                q_hi += ((qh >> (2 * c + 1)[None, :, None]) & 1) << 4
            s_lo = tl.sum(q_lo.to(tl.float32) * xe_lo[None, :, :], axis=2)  # [BN, BB*4]
            s_hi = tl.sum(q_hi.to(tl.float32) * xe_hi[None, :, :], axis=2)
            xs_lo = tl.sum(xe_lo, axis=1)[None, :]
            xs_hi = tl.sum(xe_hi, axis=1)[None, :]
            sc_lo, mn_lo = _k4_scale_min(p_w, base, 2 * c)
            sc_hi, mn_hi = _k4_scale_min(p_w, base, 2 * c + 1)
            d = tl.load(p_h + base // 2).to(tl.float32)
            dmin = tl.load(p_h + base // 2 + 1).to(tl.float32)
            part = d * (sc_lo * s_lo + sc_hi * s_hi) - dmin * (mn_lo * xs_lo + mn_hi * xs_hi)
            acc += tl.sum(part, axis=1)
    elif QT == 6:  # Q6_K (210 B): 16 sub-blocks of 16; group mm = 4n + 2h + s covers ql[16mm : 16mm+16]
        p_h = p_w.to(tl.pointer_type(tl.float16))
        p_i8 = p_w.to(tl.pointer_type(tl.int8))
        m = tl.arange(0, BB * 8)
        mm = m % 8
        n = mm // 4
        h = (mm // 2) % 2
        s = mm % 2
        li = tl.arange(0, 16)
        for b0 in range(0, K // 256, BB):
            blk = b0 + m // 8
            base = rows[:, None] * row_bytes + blk[None, :] * 210  # [BN, BB*8]
            ql = tl.load(p_w + base[:, :, None] + (mm * 16)[None, :, None] + li[None, None, :]).to(tl.int32)
            qh = tl.load(p_w + base[:, :, None] + (128 + 32 * n + 16 * s)[None, :, None] + li[None, None, :]).to(tl.int32)
            sh = (2 * h)[None, :, None]
            q_lo = (ql & 15) | (((qh >> sh) & 3) << 4)
            q_hi = (ql >> 4) | (((qh >> (sh + 4)) & 3) << 4)
            xo = (blk * 256 + 128 * n + 32 * h + 16 * s)[:, None] + li[None, :]  # [BB*8, 16]
            x_lo, xe_lo = _x_pair(p_x, p_nw, xo, NORM)
            x_hi, xe_hi = _x_pair(p_x, p_nw, xo + 64, NORM)
            if NORM:
                ss += tl.sum(tl.sum(x_lo * x_lo + x_hi * x_hi, axis=1), axis=0)
            s_lo = tl.sum((q_lo - 32).to(tl.float32) * xe_lo[None, :, :], axis=2)
            s_hi = tl.sum((q_hi - 32).to(tl.float32) * xe_hi[None, :, :], axis=2)
            sidx = (8 * n + 2 * h + s)[None, :]
            sc_lo = tl.load(p_i8 + base + 192 + sidx).to(tl.float32)
            sc_hi = tl.load(p_i8 + base + 196 + sidx).to(tl.float32)
            d = tl.load(p_h + (base + 208) // 2).to(tl.float32)
            acc += tl.sum(d * (sc_lo * s_lo + sc_hi * s_hi), axis=1)
    elif QT == 3:  # Q8_0 (34 B): f16 d, 32 int8
        p_h = p_w.to(tl.pointer_type(tl.float16))
        p_i8 = p_w.to(tl.pointer_type(tl.int8))
        m = tl.arange(0, BB)
        li = tl.arange(0, 32)
        for b0 in range(0, K // 32, BB):
            blk = b0 + m
            base = rows[:, None] * row_bytes + blk[None, :] * 34  # [BN, BB]
            q = tl.load(p_i8 + base[:, :, None] + 2 + li[None, None, :]).to(tl.float32)
            xo = (blk * 32)[:, None] + li[None, :]
            x, xe = _x_pair(p_x, p_nw, xo, NORM)
            if NORM:
                ss += tl.sum(tl.sum(x * x, axis=1), axis=0)
            d = tl.load(p_h + base // 2).to(tl.float32)
            acc += tl.sum(d * tl.sum(q * xe[None, :, :], axis=2), axis=1)
    else:  # typed F32 / F16 / BF16 rows; row_bytes is the row stride in elements here
        BK: tl.constexpr = 256 * BB
        kk = tl.arange(0, BK)
        for k0 in range(0, K, BK):
            offs = k0 + kk
            kmask = offs < K
            x = tl.load(p_x + offs, mask=kmask, other=0.0)
            if NORM:
                ss += tl.sum(x * x, axis=0)
                x = x * tl.load(p_nw + offs, mask=kmask, other=0.0)
            w = tl.load(p_w + rows[:, None] * row_bytes + offs[None, :], mask=kmask[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    return acc, ss


@triton.jit
def _segment(pid_local, p_w, row_bytes, n_rows, out_off, p_x, p_nw, p_out, p_res, p_cst, p_cw, K, eps, n_ch,
             QT: tl.constexpr, EPI: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, NORM: tl.constexpr,
             KC: tl.constexpr):
    i_r = pid_local * BN + tl.arange(0, BN)
    rmask = i_r < n_rows
    rows = tl.minimum(i_r, n_rows - 1).to(tl.int64)  # clamp instead of masking the loads
    acc, ss = _dot_rows(p_w, row_bytes, rows, p_x, p_nw, K, QT, BN, BB, NORM)
    if NORM:
        acc = acc * tl.rsqrt(ss / K + eps)
    if EPI == 1:
        acc += tl.load(p_res + i_r, mask=rmask, other=0.0)
    if EPI == 2:  # causal conv (taps oldest first) over [state rows | u], SiLU; shift the state
        conv = acc * tl.load(p_cw + i_r * KC + (KC - 1), mask=rmask, other=0.0)
        for t in tl.static_range(KC - 1):
            st = tl.load(p_cst + t * n_ch + i_r, mask=rmask, other=0.0)
            conv += st * tl.load(p_cw + i_r * KC + t, mask=rmask, other=0.0)
            if t > 0:
                tl.store(p_cst + (t - 1) * n_ch + i_r, st, mask=rmask)
        tl.store(p_cst + (KC - 2) * n_ch + i_r, acc, mask=rmask)
        acc = conv / (1.0 + tl.exp(-conv))
    tl.store(p_out + out_off + i_r, acc, mask=rmask)


@triton.jit
def _gemv_kernel(
    p_x, p_nw, p_out, p_res, p_cst, p_cw, K, eps, n_ch,
    p_w0, rb0, n0, o0, p_w1, rb1, n1, o1, p_w2, rb2, n2, o2, p_w3, rb3, n3, o3,
    NSEG: tl.constexpr, QT0: tl.constexpr, QT1: tl.constexpr, QT2: tl.constexpr, QT3: tl.constexpr,
    EPI0: tl.constexpr, SWIGLU: tl.constexpr, NORM: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
    KC: tl.constexpr,
):
    pid = tl.program_id(0)
    t0 = tl.cdiv(n0, BN)
    if SWIGLU:  # segments 0 (gate) and 1 (up) share rows: out = silu(W0 x) * (W1 x)
        i_r = pid * BN + tl.arange(0, BN)
        rmask = i_r < n0
        rows = tl.minimum(i_r, n0 - 1).to(tl.int64)
        g, ss = _dot_rows(p_w0, rb0, rows, p_x, p_nw, K, QT0, BN, BB, NORM)
        u, _ = _dot_rows(p_w1, rb1, rows, p_x, p_nw, K, QT1, BN, BB, NORM)
        if NORM:
            r = tl.rsqrt(ss / K + eps)
            g = g * r
            u = u * r
        tl.store(p_out + o0 + i_r, g / (1.0 + tl.exp(-g)) * u, mask=rmask)
    else:
        if pid < t0:
            _segment(pid, p_w0, rb0, n0, o0, p_x, p_nw, p_out, p_res, p_cst, p_cw, K, eps, n_ch,
                     QT0, EPI0, BN, BB, NORM, KC)
        if NSEG > 1:
            t1 = t0 + tl.cdiv(n1, BN)
            if pid >= t0 and pid < t1:
                _segment(pid - t0, p_w1, rb1, n1, o1, p_x, p_nw, p_out, p_res, p_cst, p_cw, K, eps, n_ch,
                         QT1, 0, BN, BB, NORM, KC)
            if NSEG > 2:
                t2 = t1 + tl.cdiv(n2, BN)
                if pid >= t1 and pid < t2:
                    _segment(pid - t1, p_w2, rb2, n2, o2, p_x, p_nw, p_out, p_res, p_cst, p_cw, K, eps, n_ch,
                             QT2, 0, BN, BB, NORM, KC)
                if NSEG > 3:
                    if pid >= t2:
                        _segment(pid - t2, p_w3, rb3, n3, o3, p_x, p_nw, p_out, p_res, p_cst, p_cw, K, eps, n_ch,
                                 QT3, 0, BN, BB, NORM, KC)


@dataclass(frozen=True)
class GemvConfig:
    """Tile shape: BN rows per program, BB K-steps (super-blocks) per loop iteration, warps."""

    block_n: int = 4
    block_b: int = 2
    num_warps: int = 4


DEFAULT_CONFIG = GemvConfig()
INTERPRETER_CONFIG = GemvConfig(block_n=512, block_b=1, num_warps=1)  # few programs: the CPU interpreter is slow


def _row_stride(w: QWeight) -> int:
    return w.row_bytes if w.is_block else w.data.stride(0)


def _fit_bb(ws: Sequence[QWeight], bb: int) -> int:
    """Largest power of two <= bb that divides every segment's count of K-steps."""
    while bb > 1:
        if all(w.qtype in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
               or (w.cols // STEP_ELEMS[QCODE[w.qtype]]) % bb == 0 for w in ws):
            return bb
        bb //= 2
    return 1


_SM_COUNT: dict = {}


def auto_config(ws: Sequence[QWeight], device, swiglu: bool = False) -> GemvConfig:
    """Tile heuristic for the GPU: 16-byte loads on big matrices (BN*BB*128 B per step), and at
    least ~2 programs per SM on small ones (fewer rows per program rather than a split over K)."""
    if device not in _SM_COUNT:
        _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    n_sm = _SM_COUNT[device]
    rows = ws[0].rows if swiglu else sum(w.rows for w in ws)
    bn = 8 if triton.cdiv(rows, 8) >= 8 * n_sm else 4
    while bn > 1 and triton.cdiv(rows, bn) < 2 * n_sm:
        bn //= 2
    bb = _fit_bb(ws, 4 if bn == 1 else 2)
    tile_bytes = bn * bb * 128 * (2 if swiglu else 1)
    return GemvConfig(bn, bb, max(1, min(8, tile_bytes // 512)))


def _launch(x, ws, out, out_offsets, *, norm_weight, eps, residual, conv_state, conv_weight, swiglu, config):
    if config is None:
        config = INTERPRETER_CONFIG if x.device.type == "cpu" else auto_config(ws, x.device, swiglu)
    cfg = config
    bn = cfg.block_n
    bb = _fit_bb(ws, cfg.block_b)
    K = ws[0].cols
    segs = list(ws) + [ws[0]] * (4 - len(ws))
    offs = list(out_offsets) + [0] * (4 - len(ws))
    args = []
    for w, o in zip(segs, offs):
        args += [w.data, _row_stride(w), w.rows, o]
    qts = [QCODE[w.qtype] for w in segs]
    if swiglu:
        grid = (triton.cdiv(ws[0].rows, bn),)
    else:
        grid = (sum(triton.cdiv(w.rows, bn) for w in ws),)
    epi = EPI_CONV if conv_state is not None else (EPI_RESIDUAL if residual is not None else EPI_NONE)
    dummy = out
    _gemv_kernel[grid](
        x, norm_weight if norm_weight is not None else dummy, out,
        residual if residual is not None else dummy,
        conv_state if conv_state is not None else dummy,
        conv_weight if conv_weight is not None else dummy,
        K, float(eps), conv_state.shape[1] if conv_state is not None else 0,
        *args,
        NSEG=len(ws), QT0=qts[0], QT1=qts[1], QT2=qts[2], QT3=qts[3], EPI0=epi, SWIGLU=bool(swiglu),
        NORM=norm_weight is not None, BN=bn, BB=bb, KC=conv_weight.shape[1] if conv_weight is not None else 4,
        num_warps=cfg.num_warps,
    )
    return out


def _check_vec(name, t, n, device):
    if t is None:
        return
    if t.dtype != torch.float32 or t.dim() != 1 or t.shape[0] != n or not t.is_contiguous() or t.device != device:
        raise ValueError(f"gemv: {name} must be a contiguous fp32 vector of {n} on {device}, "
                         f"got {tuple(t.shape)} {t.dtype} on {t.device}")


def gemv(x: torch.Tensor, weights: Sequence[QWeight], out: torch.Tensor | None = None, *,
         norm_weight: torch.Tensor | None = None, eps: float = 1e-6, residual: torch.Tensor | None = None,
         conv_state: torch.Tensor | None = None, conv_weight: torch.Tensor | None = None,
         swiglu: bool = False, config: GemvConfig | None = None) -> torch.Tensor:
    """out = concat_i(W_i x_n) with x_n = RMSNorm(x; norm_weight) if norm_weight is given.

    - residual: out = residual + W x (single matrix; residual may be `out` itself).
    - conv_state [Kc-1, C] / conv_weight [C, Kc]: segment 0's outputs go through the GDN causal
      conv + SiLU, and conv_state is shifted in place (oldest row dropped, raw W0 x appended).
    - swiglu: two matrices of equal shape; out [rows] = silu(W0 x) * (W1 x).
    Returns `out` (fp32 [sum rows], or [rows] with swiglu).
    """
    ws = list(weights)
    if not 1 <= len(ws) <= 4:
        raise ValueError(f"gemv: 1 to 4 matrices per launch, got {len(ws)}")
    K = ws[0].cols
    for w in ws:
        if w.cols != K:
            raise ValueError(f"gemv: all matrices must share the input size; {w.name} has {w.cols} columns, expected {K}")
        if w.data.device != x.device:
            raise ValueError(f"gemv: {w.name} is on {w.data.device}, x on {x.device}")
    if w.is_block and K % (256 if QCODE[w.qtype] != T_Q8_0 else 32):
        raise ValueError(f"gemv: K={K} is not a whole number of blocks")
    _check_vec("x", x, K, x.device)
    _check_vec("norm_weight", norm_weight, K, x.device)
    n_out = ws[0].rows if swiglu else sum(w.rows for w in ws)
    if swiglu and (len(ws) != 2 or ws[1].rows != ws[0].rows):
        raise ValueError(f"gemv: swiglu needs two matrices with equal rows, got {[w.rows for w in ws]}")
    if residual is not None and (len(ws) != 1 or swiglu or conv_state is not None):
        raise ValueError("gemv: residual add is for one plain matrix")
    if (conv_state is None) != (conv_weight is None):
        raise ValueError("gemv: conv_state and conv_weight go together")
    if conv_state is not None:
        C = ws[0].rows
        if conv_weight.shape[0] != C or conv_state.shape != (conv_weight.shape[1] - 1, C):
            raise ValueError(f"gemv: conv_state {tuple(conv_state.shape)} / conv_weight {tuple(conv_weight.shape)} "
                             f"do not fit {C} channels")
        if not (conv_state.is_contiguous() and conv_weight.is_contiguous()):
            raise ValueError("gemv: conv tensors must be contiguous")
    if out is None:
        out = torch.empty(n_out, dtype=torch.float32, device=x.device)
    _check_vec("out", out, n_out, x.device)
    _check_vec("residual", residual, n_out, x.device)
    offsets, o = [], 0
    for w in ws:
        offsets.append(o)
        o += w.rows
    return _launch(x, ws, out, offsets, norm_weight=norm_weight, eps=eps, residual=residual,
                   conv_state=conv_state, conv_weight=conv_weight, swiglu=swiglu, config=config)
