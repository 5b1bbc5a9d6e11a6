"""Batch-1 GEMV over GGUF blocks: y = W x for up to four matrices sharing one input, one launch.

Each program owns BN consecutive rows of one matrix ("segment") and walks the whole K axis,
BB super-blocks per step, loading the block bytes as they sit in the file and unpacking
nibbles/scales in registers; accumulation is fp32. Because every program reads all of x,
RMSNorm of x folds in for free (x*w summed, sum of squares alongside, rstd applied at the end).

Epilogues (flags): residual add (out = res + Wx; res may alias out), causal conv + SiLU with
conv-state shift on segment 0 (GDN qkv: each program owns its channels, so no race),
SwiGLU over segments 0/1 (out = silu(W0 x) * (W1 x)).

Dot paths per matrix type (GemvConfig): byte-wise (here), word-wise (words.py), or Q4_K/Q6_K
against x quantized to int8 blocks by a small launch before (x8 / x8_q6: quant_x + q8dot.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Sequence

import torch
import triton
import triton.language as tl

from ...gguf import BLOCK, GGMLType
from ...triton.weights import QWeight

from ..pdl import gdc_launch_dependents, gdc_wait, pdl_launch
from ..quant_x import Q8Vector, quantize_x
from .q8dot import dot_q4k_q8, dot_q6k_q8
from .words import dot_q4k_words, dot_q6k_words

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
def _x_pair(p_x, p_nw, offs, K, NORM: tl.constexpr, KMASK: tl.constexpr):
    """x at element offsets, and the value to multiply weights with (x * norm weight if NORM).

    KMASK: the last K-step runs past K (BB does not divide the block count); x there reads as 0,
    so the clamped (repeated) weight blocks of that step add nothing."""
    if KMASK:
        x = tl.load(p_x + offs, mask=offs < K, other=0.0)
        if NORM:
            return x, x * tl.load(p_nw + offs, mask=offs < K, other=0.0)
        return x, x
    x = tl.load(p_x + offs)
    if NORM:
        return x, x * tl.load(p_nw + offs)
    return x, x


@triton.jit
def _small_int_to_f32(q, OFFSET: tl.constexpr = 0):
    """float(q - OFFSET) for int32 0 <= q < 2^22 without an int->float conversion: OR q into the
    mantissa of 2^23 and subtract 2^23 + OFFSET (exact). cvt runs at 16/clk/SM on Hopper, the
    LOP3 + FADD on the 64- and 128-wide pipes, so a conversion per weight no longer bounds the GEMV."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)


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
              NORM: tl.constexpr, KMASK: tl.constexpr, Q6: tl.constexpr, ACC: tl.constexpr):
    """(W[rows] . x_eff) [BN] fp32 and the sum of squares of x over K (for a fused RMSNorm).

    ACC (block types): 1 = reduce each step's products to per-group sums, then scale; 2 = scale per
    element and accumulate a [BN, groups, lanes] tile, reduced once after the loop (no cross-lane
    shuffles inside the loop: 139 shuffles per thread per step in the 0.8B LM head with ACC=1)."""
    acc = tl.zeros([BN], dtype=tl.float32)
    ss = tl.zeros([1], dtype=tl.float32)
    if QT == 4 or QT == 5:  # Q4_K (144 B) / Q5_K (176 B): 8 sub-blocks of 32, as 4 groups of lo/hi nibbles
        BPB = 144 + 32 * (QT - 4)  # block bytes
        QS = 16 + 32 * (QT - 4)  # offset of qs in the block
        p_h = p_w.to(tl.pointer_type(tl.float16))
        m = tl.arange(0, BB * 4)
        c = m % 4
        li = tl.arange(0, 32)
        acc3 = tl.zeros([BN, BB * 4, 32], dtype=tl.float32)
        ss3 = tl.zeros([BB * 4, 32], dtype=tl.float32)
        for b0 in range(0, K // 256, BB):
            blk_x = b0 + m // 4  # [BB*4]
            blk = blk_x
            if KMASK:  # past-the-end steps re-read the last block (x there is 0)
                blk = tl.minimum(blk_x, K // 256 - 1)
            base = rows[:, None] * row_bytes + blk[None, :] * BPB  # [BN, BB*4] block start bytes
            q = tl.load(p_w + base[:, :, None] + QS + (c * 32)[None, :, None] + li[None, None, :]).to(tl.int32)
            xo = (blk_x * 256 + c * 64)[:, None] + li[None, :]  # [BB*4, 32]
            x_lo, xe_lo = _x_pair(p_x, p_nw, xo, K, NORM, KMASK)
            x_hi, xe_hi = _x_pair(p_x, p_nw, xo + 32, K, NORM, KMASK)
            q_lo = q & 15
            q_hi = q >> 4
            if QT == 5:
                qh = tl.load(p_w + base[:, :, None] + 16 + li[None, None, :]).to(tl.int32)
                q_lo += ((qh >> (2 * c)[None, :, None]) & 1) << 4
                q_hi += ((qh >> (2 * c + 1)[None, :, None]) & 1) << 4
            sc_lo, mn_lo = _k4_scale_min(p_w, base, 2 * c)
            sc_hi, mn_hi = _k4_scale_min(p_w, base, 2 * c + 1)
            d = tl.load(p_h + base // 2).to(tl.float32)
            dmin = tl.load(p_h + base // 2 + 1).to(tl.float32)
            if ACC == 2:
                if NORM:
                    ss3 += x_lo * x_lo + x_hi * x_hi
                w_lo = _small_int_to_f32(q_lo) * (d * sc_lo)[:, :, None] - (dmin * mn_lo)[:, :, None]
                w_hi = _small_int_to_f32(q_hi) * (d * sc_hi)[:, :, None] - (dmin * mn_hi)[:, :, None]
                acc3 += w_lo * xe_lo[None, :, :] + w_hi * xe_hi[None, :, :]
            else:
                if NORM:
                    ss += tl.sum(tl.sum(x_lo * x_lo + x_hi * x_hi, axis=1), axis=0)
                s_lo = tl.sum(_small_int_to_f32(q_lo) * xe_lo[None, :, :], axis=2)  # [BN, BB*4]
                s_hi = tl.sum(_small_int_to_f32(q_hi) * xe_hi[None, :, :], axis=2)
                xs_lo = tl.sum(xe_lo, axis=1)[None, :]
                xs_hi = tl.sum(xe_hi, axis=1)[None, :]
                part = d * (sc_lo * s_lo + sc_hi * s_hi) - dmin * (mn_lo * xs_lo + mn_hi * xs_hi)
                acc += tl.sum(part, axis=1)
        if ACC == 2:
            acc += tl.sum(tl.sum(acc3, axis=2), axis=1)
            ss += tl.sum(tl.sum(ss3, axis=1), axis=0)
    elif QT == 6 and Q6 == 1:  # Q6_K (210 B): 16 sub-blocks of 16; group mm = 4n + 2h + s covers ql[16mm : 16mm+16]
        p_h = p_w.to(tl.pointer_type(tl.float16))
        p_i8 = p_w.to(tl.pointer_type(tl.int8))
        m = tl.arange(0, BB * 8)
        mm = m % 8
        n = mm // 4
        h = (mm // 2) % 2
        s = mm % 2
        li = tl.arange(0, 16)
        acc3 = tl.zeros([BN, BB * 8, 16], dtype=tl.float32)
        ss3 = tl.zeros([BB * 8, 16], dtype=tl.float32)
        for b0 in range(0, K // 256, BB):
            blk_x = b0 + m // 8
            blk = blk_x
            if KMASK:
                blk = tl.minimum(blk_x, K // 256 - 1)
            base = rows[:, None] * row_bytes + blk[None, :] * 210  # [BN, BB*8]
            ql = tl.load(p_w + base[:, :, None] + (mm * 16)[None, :, None] + li[None, None, :]).to(tl.int32)
            qh = tl.load(p_w + base[:, :, None] + (128 + 32 * n + 16 * s)[None, :, None] + li[None, None, :]).to(tl.int32)
            sh = (2 * h)[None, :, None]
            q_lo = (ql & 15) | (((qh >> sh) & 3) << 4)
            q_hi = (ql >> 4) | (((qh >> (sh + 4)) & 3) << 4)
            xo = (blk_x * 256 + 128 * n + 32 * h + 16 * s)[:, None] + li[None, :]  # [BB*8, 16]
            x_lo, xe_lo = _x_pair(p_x, p_nw, xo, K, NORM, KMASK)
            x_hi, xe_hi = _x_pair(p_x, p_nw, xo + 64, K, NORM, KMASK)
            sidx = (8 * n + 2 * h + s)[None, :]
            sc_lo = tl.load(p_i8 + base + 192 + sidx).to(tl.float32)
            sc_hi = tl.load(p_i8 + base + 196 + sidx).to(tl.float32)
            d = tl.load(p_h + (base + 208) // 2).to(tl.float32)
            if ACC == 2:
                if NORM:
                    ss3 += x_lo * x_lo + x_hi * x_hi
                acc3 += (_small_int_to_f32(q_lo, 32) * (d * sc_lo)[:, :, None] * xe_lo[None, :, :]
                         + _small_int_to_f32(q_hi, 32) * (d * sc_hi)[:, :, None] * xe_hi[None, :, :])
            else:
                if NORM:
                    ss += tl.sum(tl.sum(x_lo * x_lo + x_hi * x_hi, axis=1), axis=0)
                s_lo = tl.sum(_small_int_to_f32(q_lo, 32) * xe_lo[None, :, :], axis=2)
                s_hi = tl.sum(_small_int_to_f32(q_hi, 32) * xe_hi[None, :, :], axis=2)
                acc += tl.sum(d * (sc_lo * s_lo + sc_hi * s_hi), axis=1)
        if ACC == 2:
            acc += tl.sum(tl.sum(acc3, axis=2), axis=1)
            ss += tl.sum(tl.sum(ss3, axis=1), axis=0)
    elif QT == 6:  # Q6 == 2. Q6_K (210 B): per 128-half n and l = 16s + li (0..31), the bytes ql[64n + l],
        # ql[64n + 32 + l] and qh[32n + l] give elements 128n + 32j + l, j = 0..3 (lo/hi nibbles of the
        # two ql runs, 2-bit pairs of qh): each byte is loaded once (160 of the 192 quant bytes before)
        p_h = p_w.to(tl.pointer_type(tl.float16))
        p_i8 = p_w.to(tl.pointer_type(tl.int8))
        m = tl.arange(0, BB * 4)
        n = (m % 4) // 2
        s = m % 2
        li = tl.arange(0, 16)
        acc3 = tl.zeros([BN, BB * 4, 16], dtype=tl.float32)
        ss3 = tl.zeros([BB * 4, 16], dtype=tl.float32)
        for b0 in range(0, K // 256, BB):
            blk_x = b0 + m // 4
            blk = blk_x
            if KMASK:
                blk = tl.minimum(blk_x, K // 256 - 1)
            base = rows[:, None] * row_bytes + blk[None, :] * 210  # [BN, BB*4]
            p_l = p_w + base[:, :, None] + (64 * n + 16 * s)[None, :, None] + li[None, None, :]
            ql_a = tl.load(p_l).to(tl.int32)
            ql_b = tl.load(p_l + 32).to(tl.int32)
            qh = tl.load(p_w + base[:, :, None] + (128 + 32 * n + 16 * s)[None, :, None] + li[None, None, :]).to(tl.int32)
            xo = (blk_x * 256 + 128 * n + 16 * s)[:, None] + li[None, :]  # [BB*4, 16]
            x0, xe0 = _x_pair(p_x, p_nw, xo, K, NORM, KMASK)
            x1, xe1 = _x_pair(p_x, p_nw, xo + 32, K, NORM, KMASK)
            x2, xe2 = _x_pair(p_x, p_nw, xo + 64, K, NORM, KMASK)
            x3, xe3 = _x_pair(p_x, p_nw, xo + 96, K, NORM, KMASK)
            q0 = _small_int_to_f32((ql_a & 15) | ((qh & 3) << 4), 32)
            q1 = _small_int_to_f32((ql_b & 15) | ((qh & 12) << 2), 32)
            q2 = _small_int_to_f32((ql_a >> 4) | (qh & 48), 32)
            q3 = _small_int_to_f32((ql_b >> 4) | ((qh >> 2) & 48), 32)
            p_sc = p_i8 + base + 192 + (8 * n + s)[None, :]  # 16-element sub-block 8n + 2j + s
            sc0 = tl.load(p_sc).to(tl.float32)
            sc1 = tl.load(p_sc + 2).to(tl.float32)
            sc2 = tl.load(p_sc + 4).to(tl.float32)
            sc3 = tl.load(p_sc + 6).to(tl.float32)
            d = tl.load(p_h + (base + 208) // 2).to(tl.float32)
            if ACC == 2:
                if NORM:
                    ss3 += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3
                acc3 += (q0 * (d * sc0)[:, :, None] * xe0[None, :, :] + q1 * (d * sc1)[:, :, None] * xe1[None, :, :]
                         + q2 * (d * sc2)[:, :, None] * xe2[None, :, :] + q3 * (d * sc3)[:, :, None] * xe3[None, :, :])
            else:
                if NORM:
                    ss += tl.sum(tl.sum(x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3, axis=1), axis=0)
                s0 = tl.sum(q0 * xe0[None, :, :], axis=2)
                s1 = tl.sum(q1 * xe1[None, :, :], axis=2)
                s2 = tl.sum(q2 * xe2[None, :, :], axis=2)
                s3 = tl.sum(q3 * xe3[None, :, :], axis=2)
                acc += tl.sum(d * (sc0 * s0 + sc1 * s1 + sc2 * s2 + sc3 * s3), axis=1)
        if ACC == 2:
            acc += tl.sum(tl.sum(acc3, axis=2), axis=1)
            ss += tl.sum(tl.sum(ss3, axis=1), axis=0)
    elif QT == 3:  # Q8_0 (34 B): f16 d, 32 int8
        p_h = p_w.to(tl.pointer_type(tl.float16))
        p_i8 = p_w.to(tl.pointer_type(tl.int8))
        m = tl.arange(0, BB)
        li = tl.arange(0, 32)
        for b0 in range(0, K // 32, BB):
            blk_x = b0 + m
            blk = blk_x
            if KMASK:
                blk = tl.minimum(blk_x, K // 32 - 1)
            base = rows[:, None] * row_bytes + blk[None, :] * 34  # [BN, BB]
            q = tl.load(p_i8 + base[:, :, None] + 2 + li[None, None, :]).to(tl.float32)
            xo = (blk_x * 32)[:, None] + li[None, :]
            x, xe = _x_pair(p_x, p_nw, xo, K, NORM, KMASK)
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
def _dot(p_w, row_bytes, rows, p_x, p_nw, p_xq, p_ds, K, QT: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
         NORM: tl.constexpr, KMASK: tl.constexpr, Q6: tl.constexpr, ACC: tl.constexpr, WORDS: tl.constexpr,
         X8: tl.constexpr, X8Q6: tl.constexpr, ASM: tl.constexpr):
    """The row dot products of one matrix: Q4_K (X8) or Q6_K (X8Q6) against the int8 x (q8dot.py),
    word-wise for Q4_K/Q6_K when WORDS (words.py), else byte-wise. The sum of squares of x is not
    formed on the int8 path (quantize_x wrote 1 / rms)."""
    if X8 and QT == 4:
        return dot_q4k_q8(p_w, row_bytes, rows, p_xq, p_ds, K, BN, BB, ASM), tl.zeros([1], dtype=tl.float32)
    elif X8Q6 and QT == 6:
        return dot_q6k_q8(p_w, row_bytes, rows, p_xq, p_ds, K, BN, BB, ASM), tl.zeros([1], dtype=tl.float32)
    elif WORDS and QT == 4:
        return dot_q4k_words(p_w, row_bytes, rows, p_x, p_nw, K, BN, BB, NORM)
    elif WORDS and QT == 6:
        return dot_q6k_words(p_w, row_bytes, rows, p_x, p_nw, K, BN, BB, NORM)
    else:
        return _dot_rows(p_w, row_bytes, rows, p_x, p_nw, K, QT, BN, BB, NORM, KMASK, Q6, ACC)


@triton.jit
def _l2_prefetch_rows(p_w, row_bytes, rows, QT: tl.constexpr, LINES: tl.constexpr):
    """Pull this program's weight rows into L2 (PDL prologue: weights do not depend on the previous
    kernel, so their DRAM latency overlaps its tail). Block-quantized rows only (byte strides)."""
    if QT >= 3 and LINES > 0:  # LINES = 0: PDL without the prefetch
        ln = tl.arange(0, LINES) * 128
        ptrs = p_w + rows[:, None] * row_bytes + tl.minimum(ln, row_bytes - 1)[None, :]
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _rms_scale(ss, K, eps, p_rstd, QX: tl.constexpr):
    """1 / rms(x): from this program's sum of squares, or as quantize_x wrote it (int8-x launches)."""
    if QX:
        return tl.load(p_rstd + tl.zeros([1], dtype=tl.int32))  # [1], as the rsqrt below
    return tl.rsqrt(ss / K + eps)


@triton.jit
def _segment(pid_local, p_w, row_bytes, n_rows, out_off, p_x, p_nw, p_out, p_res, p_cst, p_cw, p_xq, p_ds, p_rstd,
             K, eps, n_ch,
             QT: tl.constexpr, EPI: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, NORM: tl.constexpr,
             KC: tl.constexpr, KMASK: tl.constexpr, Q6: tl.constexpr, PDL: tl.constexpr, LINES: tl.constexpr,
             ACC: tl.constexpr, WORDS: tl.constexpr, X8: tl.constexpr, X8Q6: tl.constexpr, ASM: tl.constexpr):
    i_r = pid_local * BN + tl.arange(0, BN)
    rmask = i_r < n_rows
    rows = tl.minimum(i_r, n_rows - 1).to(tl.int64)  # clamp instead of masking the loads
    if PDL:  # let the next kernel get scheduled, prefetch, then wait for the previous kernel's x / out
        gdc_launch_dependents()
        _l2_prefetch_rows(p_w, row_bytes, rows, QT, LINES)
        gdc_wait()
    acc, ss = _dot(p_w, row_bytes, rows, p_x, p_nw, p_xq, p_ds, K, QT, BN, BB, NORM, KMASK, Q6, ACC, WORDS, X8, X8Q6, ASM)
    if NORM:
        acc = acc * _rms_scale(ss, K, eps, p_rstd, X8 or X8Q6)
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
    p_x, p_nw, p_out, p_res, p_cst, p_cw, p_xq, p_ds, p_rstd, K, eps, n_ch,
    p_w0, rb0, n0, o0, p_w1, rb1, n1, o1, p_w2, rb2, n2, o2, p_w3, rb3, n3, o3,
    NSEG: tl.constexpr, QT0: tl.constexpr, QT1: tl.constexpr, QT2: tl.constexpr, QT3: tl.constexpr,
    EPI0: tl.constexpr, SWIGLU: tl.constexpr, NORM: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
    KC: tl.constexpr, KMASK: tl.constexpr, Q6: tl.constexpr, PDL: tl.constexpr, LINES: tl.constexpr,
    ACC: tl.constexpr, WORDS: tl.constexpr, X8: tl.constexpr, X8Q6: tl.constexpr, ASM: tl.constexpr,
):
    pid = tl.program_id(0)
    t0 = tl.cdiv(n0, BN)
    if SWIGLU:  # segments 0 (gate) and 1 (up) share rows: out = silu(W0 x) * (W1 x)
        i_r = pid * BN + tl.arange(0, BN)
        rmask = i_r < n0
        rows = tl.minimum(i_r, n0 - 1).to(tl.int64)
        if PDL:
            gdc_launch_dependents()
            _l2_prefetch_rows(p_w0, rb0, rows, QT0, LINES)
            _l2_prefetch_rows(p_w1, rb1, rows, QT1, LINES)
            gdc_wait()
        g, ss = _dot(p_w0, rb0, rows, p_x, p_nw, p_xq, p_ds, K, QT0, BN, BB, NORM, KMASK, Q6, ACC, WORDS, X8, X8Q6, ASM)
        u, _ = _dot(p_w1, rb1, rows, p_x, p_nw, p_xq, p_ds, K, QT1, BN, BB, NORM, KMASK, Q6, ACC, WORDS, X8, X8Q6, ASM)
        if NORM:
            r = _rms_scale(ss, K, eps, p_rstd, X8 or X8Q6)
            g = g * r
            u = u * r
        tl.store(p_out + o0 + i_r, g / (1.0 + tl.exp(-g)) * u, mask=rmask)
    else:
        if pid < t0:
            _segment(pid, p_w0, rb0, n0, o0, p_x, p_nw, p_out, p_res, p_cst, p_cw, p_xq, p_ds, p_rstd,
                     K, eps, n_ch, QT0, EPI0, BN, BB, NORM, KC, KMASK, Q6, PDL, LINES, ACC, WORDS, X8, X8Q6, ASM)
        if NSEG > 1:
            t1 = t0 + tl.cdiv(n1, BN)
            if pid >= t0 and pid < t1:
                _segment(pid - t0, p_w1, rb1, n1, o1, p_x, p_nw, p_out, p_res, p_cst, p_cw, p_xq, p_ds, p_rstd,
                         K, eps, n_ch, QT1, 0, BN, BB, NORM, KC, KMASK, Q6, PDL, LINES, ACC, WORDS, X8, X8Q6, ASM)
            if NSEG > 2:
                t2 = t1 + tl.cdiv(n2, BN)
                if pid >= t1 and pid < t2:
                    _segment(pid - t1, p_w2, rb2, n2, o2, p_x, p_nw, p_out, p_res, p_cst, p_cw, p_xq, p_ds, p_rstd,
                             K, eps, n_ch, QT2, 0, BN, BB, NORM, KC, KMASK, Q6, PDL, LINES, ACC, WORDS, X8, X8Q6, ASM)
                if NSEG > 3:
                    if pid >= t2:
                        _segment(pid - t2, p_w3, rb3, n3, o3, p_x, p_nw, p_out, p_res, p_cst, p_cw, p_xq, p_ds, p_rstd,
                                 K, eps, n_ch, QT3, 0, BN, BB, NORM, KC, KMASK, Q6, PDL, LINES, ACC, WORDS, X8, X8Q6, ASM)


@dataclass(frozen=True)
class GemvConfig:
    """Tile shape: BN rows per program, BB K-steps (super-blocks) per loop iteration, warps.

    BB need not divide the block count: the last step is then masked (x reads 0 past K)."""

    block_n: int = 4
    block_b: int = 2
    num_warps: int = 4
    q6: int = 1  # Q6_K unpacking: 1 = 8 groups of 16 (qh read twice), 2 = qh read once (4 outputs per byte)
    pdl: bool = False  # programmatic dependent launch + L2 prefetch of the weights before waiting (sm_90)
    acc: int = 2  # 2 = per-element scaled accumulator reduced after the K loop; 1 = reduce every step
    num_stages: int | None = None  # software-pipelining depth of the K loop (None: Triton's default, 3 on sm_90)
    words: bool = False  # Q4_K/Q6_K rows loaded as int32 words and unpacked in registers (words.py)
    prefetch: bool = True  # with pdl: pull the program's weight rows into L2 before waiting
    x8: bool = False  # Q4_K rows against x quantized to int8 blocks (quant_x), dp4a dots (q8dot.py)
    x8_q6: bool = False  # the same for Q6_K rows (BB even: block pairs)


@dataclass(frozen=True)
class AutoTile:
    """Pick the tile per launch from the matrix shapes: version 1 = the first heuristic (BB <= 2,
    warps from the tile size), version 2 = enough bytes in flight per SM (see auto_config_v2),
    version 3 = the words path's (auto_config_v3). Versions 1 and 2 are the byte-wise path
    (words=False) they were tuned for."""

    version: int = 2
    q6: int = 1  # as GemvConfig.q6
    pdl: bool = False  # as GemvConfig.pdl
    acc: int = 2  # as GemvConfig.acc
    num_stages: int | None = None  # as GemvConfig.num_stages
    bn_scale: int = 1  # rows per program x this (x loads and unpack setup shared by more rows)
    num_warps: int | None = None  # override the heuristic's warps
    words: bool | None = None  # as GemvConfig.words; None = the path the heuristic was tuned for (v3: words)
    prefetch: bool = True  # as GemvConfig.prefetch
    x8: bool = False  # as GemvConfig.x8
    x8_q6: bool = False  # as GemvConfig.x8_q6


def tile_key(ws: Sequence[QWeight], swiglu: bool = False) -> str:
    """The key of a launch in a TileTable: matrix types and shapes, and whether it is a SwiGLU pair."""
    mats = "+".join(f"{w.qtype.name}:{w.rows}x{w.cols}" for w in ws)
    return mats + (":swiglu" if swiglu else "")


@dataclass(frozen=True)
class TileTable:
    """Measured tiles per launch shape (bench/profiling/gemv_sweep.py writes them): the entry for a launch's
    tile_key, else `fallback`. Entries are (key, GemvConfig) pairs, so the table is hashable."""

    entries: tuple[tuple[str, GemvConfig], ...] = ()
    fallback: AutoTile = AutoTile(2, words=False)

    @classmethod
    def from_dict(cls, table: dict, fallback: AutoTile | None = None) -> "TileTable":
        """{key: {block_n, block_b, num_warps, words, ...}} (the sweep's JSON) -> TileTable."""
        entries = tuple((k, GemvConfig(**v)) for k, v in sorted(table.items()))
        return cls(entries) if fallback is None else cls(entries, fallback)

    @cached_property
    def _by_key(self) -> dict[str, GemvConfig]:
        return dict(self.entries)

    def lookup(self, ws: Sequence[QWeight], swiglu: bool = False) -> GemvConfig | AutoTile:
        return self._by_key.get(tile_key(ws, swiglu), self.fallback)

    def replaced(self, only: str | None = None, **fields) -> "TileTable":
        """This table with `fields` replaced in every entry and the fallback (GemvConfig and AutoTile
        share those names), or only in the entries whose key contains `only`."""
        return TileTable(tuple((k, replace(c, **fields) if only is None or only in k else c) for k, c in self.entries),
                         self.fallback if only is not None else replace(self.fallback, **fields))


DEFAULT_CONFIG = GemvConfig()
INTERPRETER_CONFIG = GemvConfig(block_n=512, block_b=1, num_warps=1)  # few programs: the CPU interpreter is slow


def _row_stride(w: QWeight) -> int:
    return w.row_bytes if w.is_block else w.data.stride(0)


def _k_steps(w: QWeight) -> int | None:
    """K-steps (super-blocks) of a block-quantized matrix; None for typed rows (masked by K anyway)."""
    if w.qtype in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        return None
    return w.cols // STEP_ELEMS[QCODE[w.qtype]]


def _fit_bb(ws: Sequence[QWeight], bb: int) -> int:
    """Largest power of two <= bb that divides every segment's count of K-steps."""
    while bb > 1:
        if all(_k_steps(w) is None or _k_steps(w) % bb == 0 for w in ws):
            return bb
        bb //= 2
    return 1


_SM_COUNT: dict = {}


def set_sm_count(device, n_sm: int) -> None:
    """Pretend `device` has n_sm SMs (recording launches on the meta device; tests)."""
    _SM_COUNT[torch.device(device)] = n_sm


def sm_count(device) -> int:
    device = torch.device(device)
    if device not in _SM_COUNT:
        _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT[device]


def _rows_per_program(rows: int, n_sm: int) -> int:
    bn = 8 if triton.cdiv(rows, 8) >= 8 * n_sm else 4
    while bn > 1 and triton.cdiv(rows, bn) < 2 * n_sm:
        bn //= 2
    return bn


def auto_config(ws: Sequence[QWeight], device, swiglu: bool = False) -> GemvConfig:
    """Tile heuristic v1: 16-byte loads on big matrices (BN*BB*128 B per step), and at least ~2
    programs per SM on small ones (fewer rows per program rather than a split over K)."""
    rows = ws[0].rows if swiglu else sum(w.rows for w in ws)
    bn = _rows_per_program(rows, sm_count(device))
    bb = _fit_bb(ws, 4 if bn == 1 else 2)
    tile_bytes = bn * bb * 128 * (2 if swiglu else 1)
    return GemvConfig(bn, bb, max(1, min(8, tile_bytes // 512)))


IN_FLIGHT_BYTES_PER_SM = 32 << 10  # ~ bandwidth x latency / SMs on an H200 (4.8 TB/s x ~0.9 us / 132)
MAX_RESIDENT_PROGRAMS = 8  # rough occupancy cap (registers) for the per-SM in-flight estimate


def auto_config_v2(ws: Sequence[QWeight], device, swiglu: bool = False) -> GemvConfig:
    """Tile heuristic v2: as many rows per program as v1, then BB so that the programs resident
    on an SM have ~IN_FLIGHT_BYTES_PER_SM of weights loading at once (a GEMV only reaches the
    copy bandwidth with that much in flight). Small matrices (0.8B: 1024 rows x K<=3584, 512
    programs, < 4 per SM) get their whole K in one masked step instead of 7 steps of 512 B with
    one warp. Warps: v1's rule (one per 512 B of 4-bit tile), at least 4."""
    n_sm = sm_count(device)
    rows = ws[0].rows if swiglu else sum(w.rows for w in ws)
    bn = _rows_per_program(rows, n_sm)
    resident = max(1.0, min(MAX_RESIDENT_PROGRAMS, triton.cdiv(rows, bn) / n_sm))
    block_bytes = max((BLOCK[w.qtype][1] if w.is_block else 256 * w.data.element_size()) for w in ws)
    per_step = bn * block_bytes  # swiglu: gate and up are two loops one after the other, not one tile
    steps = [s for s in (_k_steps(w) for w in ws) if s is not None] or [triton.cdiv(ws[0].cols, 256)]
    want = IN_FLIGHT_BYTES_PER_SM / (resident * per_step)
    bb = 1
    while bb * 2 <= min(16, triton.next_power_of_2(max(steps))) and bb * 1.5 < want:
        bb *= 2
    tile_bytes = bn * bb * 128 * (2 if swiglu else 1)  # v1's measure, so unchanged tiles keep v1's warps
    return GemvConfig(bn, bb, max(4, min(8, tile_bytes // 512)))


WORDS_STEP_BYTES = 4 << 10  # weight bytes one program loads per K-step on the words path


def auto_config_v3(ws: Sequence[QWeight], device, swiglu: bool = False) -> GemvConfig:
    """Tile heuristic for the words path: v1's rows per program (>= 2 programs per SM), then the
    largest BB <= 8 that every matrix can take (words_fit) with at most WORDS_STEP_BYTES per step;
    4 warps (the words tiles hold a quarter of the registers of the byte-wise ones)."""
    n_sm = sm_count(device)
    rows = ws[0].rows if swiglu else sum(w.rows for w in ws)
    bn = _rows_per_program(rows, n_sm)
    block_bytes = max((BLOCK[w.qtype][1] if w.is_block else 256 * w.data.element_size()) for w in ws)
    bb = 8
    while bb > 2 and (bn * bb * block_bytes > WORDS_STEP_BYTES or not all(words_fit(w, bb) for w in ws)):
        bb //= 2
    return GemvConfig(bn, bb, 4, words=True)


def resolve_config(config: GemvConfig | AutoTile | TileTable | None, ws: Sequence[QWeight], device,
                   swiglu: bool = False) -> GemvConfig:
    """The concrete tile of one launch: AutoTile picks it from the shapes (the interpreter on CPU
    always gets INTERPRETER_CONFIG: few programs)."""
    device = torch.device(device)
    if config is None:
        config = AutoTile()
    if isinstance(config, TileTable):
        config = config.lookup(ws, swiglu) if device.type != "cpu" else config.fallback
    if isinstance(config, AutoTile):
        words = config.version == 3 if config.words is None else config.words
        if device.type == "cpu":  # the words path needs whole block pairs per step (Q6_K)
            return replace(INTERPRETER_CONFIG, block_b=2 if words or config.x8_q6 else 1, words=words, x8=config.x8,
                           x8_q6=config.x8_q6)
        heuristic = {1: auto_config, 2: auto_config_v2, 3: auto_config_v3}[config.version]
        tile = heuristic(ws, device, swiglu)
        return GemvConfig(tile.block_n * config.bn_scale, tile.block_b, config.num_warps or tile.num_warps,
                          config.q6, config.pdl, config.acc, config.num_stages, words, config.prefetch,
                          config.x8, config.x8_q6)
    return config


WORDS_TYPES = (GGMLType.Q4_K, GGMLType.Q6_K)


def words_fit(w: QWeight, bb: int) -> bool:
    """Whether the words path can read this matrix with BB blocks per step: whole steps, word-aligned
    rows (Q4_K: 16-byte aligned, so the payload loads as 16-byte vectors), whole 420-byte block
    pairs for Q6_K. Other types keep the byte-wise path in the same launch."""
    if w.qtype not in WORDS_TYPES:
        return True
    nblk = w.cols // 256
    align = 16 if w.qtype == GGMLType.Q4_K else 4
    aligned = w.row_bytes % align == 0 and w.data.data_ptr() % align == 0 and w.data.stride(0) == w.row_bytes
    pairs = w.qtype != GGMLType.Q6_K or bb % 2 == 0
    return aligned and pairs and nblk % bb == 0


def _x8_type_applies(on: bool, qtype: GGMLType, ws: Sequence[QWeight], bb: int) -> bool:
    mats = [w for w in ws if w.qtype == qtype]
    return on and bool(mats) and all(words_fit(w, bb) for w in mats)


def x8_paths(cfg: GemvConfig, ws: Sequence[QWeight]) -> tuple[bool, bool]:
    """Whether the launch's Q4_K and its Q6_K matrices take the dp4a path: asked for, and every
    matrix of that type readable in whole word-aligned steps of BB blocks (whole block pairs for
    Q6_K). Other types in the launch keep the fp32 x."""
    return (_x8_type_applies(cfg.x8, GGMLType.Q4_K, ws, cfg.block_b),
            _x8_type_applies(cfg.x8_q6, GGMLType.Q6_K, ws, cfg.block_b))


def x8_applies(cfg: GemvConfig, ws: Sequence[QWeight]) -> bool:
    """Whether any matrix of the launch takes the dp4a path (x is quantized first)."""
    return any(x8_paths(cfg, ws))


def _launch(x, ws, out, out_offsets, *, norm_weight, eps, residual, conv_state, conv_weight, swiglu, config, q8):
    cfg = resolve_config(config, ws, x.device, swiglu)
    bn = cfg.block_n
    bb = cfg.block_b
    words = cfg.words and any(w.qtype in WORDS_TYPES for w in ws) and all(words_fit(w, bb) for w in ws)
    x8_q4, x8_q6 = x8_paths(cfg, ws)
    x8 = x8_q4 or x8_q6
    if x8:  # the int8 blocks of x (times the norm weight) and 1 / rms, one small launch before
        q8 = quantize_x(x, q8 if q8 is not None else Q8Vector.empty(ws[0].cols, x.device), norm_weight, eps)
    kmask = any(s is not None and s % bb for s in map(_k_steps, ws))
    pdl, pdl_kw = pdl_launch(cfg.pdl, x.device, "gemv")
    if cfg.num_stages is not None:
        pdl_kw = dict(pdl_kw, num_stages=cfg.num_stages)
    lines = triton.next_power_of_2(max(1, max(triton.cdiv(_row_stride(w), 128) for w in ws if w.is_block)
                                       if any(w.is_block for w in ws) else 1))
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
        *((q8.q, q8.ds, q8.rstd) if x8 else (dummy, dummy, dummy)),
        K, float(eps), conv_state.shape[1] if conv_state is not None else 0,
        *args,
        NSEG=len(ws), QT0=qts[0], QT1=qts[1], QT2=qts[2], QT3=qts[3], EPI0=epi, SWIGLU=bool(swiglu),
        NORM=norm_weight is not None, BN=bn, BB=bb, KC=conv_weight.shape[1] if conv_weight is not None else 4,
        KMASK=kmask, Q6=cfg.q6, ACC=cfg.acc, WORDS=words, X8=x8_q4, X8Q6=x8_q6,
        ASM=x.device.type != "cpu",  # dp4a as inline PTX; the interpreter runs its unpacked twin
        PDL=pdl, LINES=(lines if cfg.prefetch else 0) if pdl else 1, num_warps=cfg.num_warps,
        **pdl_kw,
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
         swiglu: bool = False, config: GemvConfig | AutoTile | TileTable | None = None,
         q8: Q8Vector | None = None) -> torch.Tensor:
    """out = concat_i(W_i x_n) with x_n = RMSNorm(x; norm_weight) if norm_weight is given.

    - residual: out = residual + W x (single matrix; residual may be `out` itself).
    - conv_state [Kc-1, C] / conv_weight [C, Kc]: segment 0's outputs go through the GDN causal
      conv + SiLU, and conv_state is shifted in place (oldest row dropped, raw W0 x appended).
    - swiglu: two matrices of equal shape; out [rows] = silu(W0 x) * (W1 x).
    - q8: where the config's x8 path applies, the buffer x is quantized into (else one is allocated;
      a CUDA graph needs it preallocated).
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
                   conv_state=conv_state, conv_weight=conv_weight, swiglu=swiglu, config=config, q8=q8)
