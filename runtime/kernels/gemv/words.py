"""Word-wise K-quant dot products for the decode GEMV (the `words` path of kernel.py).

The byte-wise path loads every quant byte as its own element and widens it to int32 (4x the
registers of the bytes in flight, 1-byte loads for Q6_K's 210-byte blocks). Here the payload
is loaded as int32 words (16-byte vectors for Q4_K, whose blocks and rows are 16-aligned) and
unpacked in registers, 4 or 8 weights per word:

* A 4- or 6-bit value v is moved to the top of an fp32 mantissa and OR-ed with the exponent
  of 1.0, giving f = 1 + v/16 (or 1 + v/64) in two integer ops and no conversion; the sums
  are then fixed up once per sub-block: sum(v x) = 16 (sum(f x) - sum(x)).
* Q6_K blocks are 210 bytes, so within a row every other block starts 2 bytes past a word
  boundary. Blocks are taken in pairs (420 bytes, 105 words, word-aligned when the row is):
  the even block's words are read as they are, the odd block's word k is the funnel of
  physical words 52+k and 53+k (the second load of each pair hits L1).

Element order inside a Q4_K block: word w = 8c + j holds bytes 4j..4j+3 of group c; low
nibbles are elements 64c + 4j + b (sub-block 2c), high nibbles 64c + 32 + 4j + b (2c + 1).
Q6_K: logical ql word 4s + j (s = 0..7, j = 0..3) and qh word 32 + 8(s//4) + 4(s%2) + j give
elements 128n + 32t + 16h + 4j + b (n = s//4, t = (s//2)%2, h = s%2; scale 8n + 2t + h) from
the low nibbles and qh bits 2t, and 64 elements later (scale + 4) from the high nibbles and qh
bits 2t + 4 (architecture reference §8.4).
"""
from __future__ import annotations

import triton
import triton.language as tl

ONE_F32 = tl.constexpr(0x3F800000)  # bits of 1.0f
NIB_MANT = tl.constexpr(0x780000)  # a 4-bit value at mantissa bits 19..22: 1 + v/16
SIX_MANT = tl.constexpr(0x7E0000)  # a 6-bit value at mantissa bits 17..22: 1 + v/64


@triton.jit
def _unit(q, SHIFT: tl.constexpr, MASK: tl.constexpr):
    """1 + v/2^bits as fp32, v the bit field of q that SHIFT (left if >= 0) moves under MASK."""
    if SHIFT >= 0:
        v = q << SHIFT
    else:
        v = q >> (-SHIFT)
    return ((v & MASK) | ONE_F32).to(tl.float32, bitcast=True)


@triton.jit
def _x_eff(p_x, p_nw, offs, NORM: tl.constexpr):
    """x at offs, and x * norm weight when NORM (the RMSNorm scale is applied by the caller).

    Each x tile has fewer elements than the program has threads, so Triton rematerialises the
    load in the weight tile's layout instead of converting it through shared memory."""
    x = tl.load(p_x + offs)
    if NORM:
        return x, x * tl.load(p_nw + offs)
    return x, x


@triton.jit
def _f16_bits(v):
    """fp32 of the fp16 whose bits are the low 16 bits of int32 v."""
    return v.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k4_scales(w1, w2, w3, j):
    """6-bit scale and min of sub-block j (int tensor, 0..7) from the 12 scale bytes as words."""
    sh = 8 * (j % 4)
    sc_a = (w1 >> sh) & 63
    mn_a = (w2 >> sh) & 63
    sc_b = ((w3 >> sh) & 15) | (((w1 >> (sh + 6)) & 3) << 4)
    mn_b = ((w3 >> (sh + 4)) & 15) | (((w2 >> (sh + 6)) & 3) << 4)
    low = j < 4
    return tl.where(low, sc_a, sc_b).to(tl.float32), tl.where(low, mn_a, mn_b).to(tl.float32)


@triton.jit
def _x4(p_x, p_nw, offs, NORM: tl.constexpr):
    """The effective x of bytes b = 0..3 of each word (elements offs + b) and sum of x^2 over them."""
    x0, e0 = _x_eff(p_x, p_nw, offs, NORM)
    x1, e1 = _x_eff(p_x, p_nw, offs + 1, NORM)
    x2, e2 = _x_eff(p_x, p_nw, offs + 2, NORM)
    x3, e3 = _x_eff(p_x, p_nw, offs + 3, NORM)
    return e0, e1, e2, e3, x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3


@triton.jit
def _word_dot(q, e0, e1, e2, e3, start, S0: tl.constexpr, MASK: tl.constexpr):
    """start + sum_b f_b e_b over the four bytes of each word, f_b = 1 + v_b/2^bits with v_b at bits
    8b + (field offset); S0 = the shift that moves byte 0's field under MASK. One FFMA per weight:
    `start` carries the -sum(e) (times the bias) that undoes the implicit 1 of the mantissa trick."""
    acc = start + _unit(q, S0, MASK) * e0[None]
    acc += _unit(q, S0 - 8, MASK) * e1[None]
    acc += _unit(q, S0 - 16, MASK) * e2[None]
    acc += _unit(q, S0 - 24, MASK) * e3[None]
    return acc


@triton.jit
def dot_q4k_words(p_w, row_bytes, rows, p_x, p_nw, K, BN: tl.constexpr, BB: tl.constexpr, NORM: tl.constexpr):
    """(W[rows] . x_eff) [BN] fp32 and sum(x^2) [1] for Q4_K rows; BB must divide K // 256 and rows
    must be 16-byte aligned (Q4_K rows always are: 144-byte blocks)."""
    acc = tl.zeros([BN], dtype=tl.float32)
    ss3 = tl.zeros([BB, 4, 8], dtype=tl.float32)
    bi = tl.arange(0, BB)
    c = tl.arange(0, 4)
    jj = tl.arange(0, 8)
    p_w32 = p_w.to(tl.pointer_type(tl.int32))
    row_w = rows * (row_bytes // 16) * 4  # [BN] word offset of each row; x4 keeps the 16-byte alignment visible
    w_in_blk = 4 + (8 * c)[None, None, :, None] + jj[None, None, None, :]  # qs words after the 16-byte header
    x_in_blk = (64 * c)[None, :, None] + (4 * jj)[None, None, :]  # [1, 4, 8]: element of byte 0 (low nibble)
    j_lo = (2 * c)[None, None, :]
    for b0 in range(0, K // 256, BB):
        blk = b0 + bi
        p32 = p_w32 + row_w[:, None] + (blk * 36)[None, :]  # [BN, BB] block starts
        q = tl.load(p32[:, :, None, None] + w_in_blk)  # [BN, BB, 4, 8]
        w0 = tl.load(p32)
        w1 = tl.load(p32 + 1)[:, :, None]
        w2 = tl.load(p32 + 2)[:, :, None]
        w3 = tl.load(p32 + 3)[:, :, None]
        xo = (blk * 256)[:, None, None] + x_in_blk  # [BB, 4, 8]
        l0, l1, l2, l3, sq_l = _x4(p_x, p_nw, xo, NORM)
        h0, h1, h2, h3, sq_h = _x4(p_x, p_nw, xo + 32, NORM)
        if NORM:
            ss3 += sq_l + sq_h
        xw_lo = l0 + l1 + l2 + l3  # [BB, 4, 8] per word
        xw_hi = h0 + h1 + h2 + h3
        # sum over the word of (v/16) x: low nibbles at bits 8b (shift 19 - 8b), high at 8b + 4
        s_lo = 16.0 * tl.sum(_word_dot(q, l0, l1, l2, l3, -xw_lo[None], 19, NIB_MANT), axis=3)  # [BN, BB, 4]
        s_hi = 16.0 * tl.sum(_word_dot(q, h0, h1, h2, h3, -xw_hi[None], 15, NIB_MANT), axis=3)
        # sum of x per sub-block (for the mins), reduced in the weight tile's layout: the tile's
        # threads already hold these x, and a [BB, 4] reduction of its own would go through shared memory
        x_lo = tl.sum(tl.broadcast_to(xw_lo[None], q.shape), axis=3)  # [BN, BB, 4]
        x_hi = tl.sum(tl.broadcast_to(xw_hi[None], q.shape), axis=3)
        sc_lo, mn_lo = _k4_scales(w1, w2, w3, j_lo)
        sc_hi, mn_hi = _k4_scales(w1, w2, w3, j_lo + 1)
        d = _f16_bits(w0)[:, :, None]
        dmin = _f16_bits(w0 >> 16)[:, :, None]
        part = d * (sc_lo * s_lo + sc_hi * s_hi) - dmin * (mn_lo * x_lo + mn_hi * x_hi)
        acc += tl.sum(tl.sum(part, axis=2), axis=1)
    ss = tl.zeros([1], dtype=tl.float32) + tl.sum(tl.sum(tl.sum(ss3, axis=2), axis=1), axis=0)
    return acc, ss


@triton.jit
def _funnel16(lo, hi):
    """The word that starts 2 bytes into `lo` and runs into `hi` (little-endian)."""
    return ((lo >> 16) & 0xFFFF) | (hi << 16)


@triton.jit
def _q6k_block(p32, p_blk, blk, p_x, p_nw, qlw, qhw, sidx, x_in_blk, ODD: tl.constexpr, NORM: tl.constexpr):
    """Partial dot [BN] and the x^2 tile [BP, 8, 4] of one Q6_K block of each pair (even or odd)."""
    if ODD:
        ql = _funnel16(tl.load(p32[:, :, None, None] + 52 + qlw), tl.load(p32[:, :, None, None] + 53 + qlw))
        qh = _funnel16(tl.load(p32[:, :, None, None] + 52 + qhw), tl.load(p32[:, :, None, None] + 53 + qhw))
    else:
        ql = tl.load(p32[:, :, None, None] + qlw)  # [BN, BP, 8, 4]
        qh = tl.load(p32[:, :, None, None] + qhw)
    t2 = 2 * ((tl.arange(0, 8) // 2) % 2)[None, None, :, None]  # qh bit pair 2t of the low-nibble quarter
    v_lo = (ql & 0x0F0F0F0F) | ((qh << (4 - t2)) & 0x30303030)  # four 6-bit values per word
    v_hi = ((ql >> 4) & 0x0F0F0F0F) | ((qh >> t2) & 0x30303030)
    p_sc = p_blk.to(tl.pointer_type(tl.int8))[:, :, None] + 192 + sidx[None, None, :]  # [BN, BP, 8]
    sc_lo = tl.load(p_sc).to(tl.float32)
    sc_hi = tl.load(p_sc + 4).to(tl.float32)
    d = tl.load((p_blk + 208).to(tl.pointer_type(tl.float16))).to(tl.float32)[:, :, None]  # [BN, BP, 1]
    xo = (blk * 256)[:, None, None] + x_in_blk  # [BP, 8, 4]
    l0, l1, l2, l3, sq_l = _x4(p_x, p_nw, xo, NORM)
    h0, h1, h2, h3, sq_h = _x4(p_x, p_nw, xo + 64, NORM)
    sq = sq_l + sq_h
    # sum((v - 32) x) = 64 (sum(f x) - 1.5 sum(x)) per word, summed over the 16-element sub-block
    s_lo = 64.0 * tl.sum(_word_dot(v_lo, l0, l1, l2, l3, -1.5 * (l0 + l1 + l2 + l3)[None], 17, SIX_MANT), axis=3)
    s_hi = 64.0 * tl.sum(_word_dot(v_hi, h0, h1, h2, h3, -1.5 * (h0 + h1 + h2 + h3)[None], 17, SIX_MANT), axis=3)
    part = d * (sc_lo * s_lo + sc_hi * s_hi)
    return tl.sum(tl.sum(part, axis=2), axis=1), sq


@triton.jit
def dot_q6k_words(p_w, row_bytes, rows, p_x, p_nw, K, BN: tl.constexpr, BB: tl.constexpr, NORM: tl.constexpr):
    """(W[rows] . x_eff) [BN] fp32 and sum(x^2) [1] for Q6_K rows. BB (even) must divide K // 256,
    and rows must be word-aligned (row_bytes % 4 == 0, i.e. an even count of blocks)."""
    BP: tl.constexpr = BB // 2
    acc = tl.zeros([BN], dtype=tl.float32)
    ss3 = tl.zeros([BP, 8, 4], dtype=tl.float32)
    pi = tl.arange(0, BP)
    s8 = tl.arange(0, 8)
    j4 = tl.arange(0, 4)
    n = s8 // 4
    t = (s8 // 2) % 2
    h = s8 % 2
    qlw = (4 * s8)[None, None, :, None] + j4[None, None, None, :]
    qhw = (32 + 8 * n + 4 * h)[None, None, :, None] + j4[None, None, None, :]
    sidx = 8 * n + 2 * t + h
    x_in_blk = (128 * n + 32 * t + 16 * h)[None, :, None] + (4 * j4)[None, None, :]  # [1, 8, 4]: byte 0
    for p0 in range(0, K // 512, BP):
        pair = p0 + pi
        p_pair = p_w + rows[:, None] * row_bytes + pair[None, :] * 420  # [BN, BP], word-aligned
        p32 = p_pair.to(tl.pointer_type(tl.int32))
        a0, sq0 = _q6k_block(p32, p_pair, 2 * pair, p_x, p_nw, qlw, qhw, sidx, x_in_blk, False, NORM)
        a1, sq1 = _q6k_block(p32, p_pair + 210, 2 * pair + 1, p_x, p_nw, qlw, qhw, sidx, x_in_blk, True, NORM)
        acc += a0 + a1
        if NORM:
            ss3 += sq0 + sq1
    ss = tl.zeros([1], dtype=tl.float32) + tl.sum(tl.sum(tl.sum(ss3, axis=2), axis=1), axis=0)
    return acc, ss
