"""Q4_K and Q6_K rows times an int8-quantized x (quant_x.Q8Vector): the GEMV's dp4a path
(GemvConfig.x8 for Q4_K, x8_q6 for Q6_K).

The word-wise path (words.py) spends three instructions per weight (shift, mask-or, FFMA) and
moves fp32 x into the weight tile's layout through shared memory every K-step. Here a Q4_K
payload word (bytes 4j..4j+3 of group c) gives its four low nibbles with one AND and its high
nibbles with a shift and an AND; each meets one word of four int8 x (elements 64c + 4j + b and
64c + 32 + 4j + b are x words 16c + j and 16c + 8 + j), and dp4a does the four multiply-adds.
Per 32-element sub-block: d_w sc (sum q_w q_x) d_x - dmin mn s_x, s_x = d_x sum(q_x).

Q6_K (architecture reference §8.4): for each 128-half n and l = 16t + 4j + b, the ql words A (bytes
64n + l) and B (64n + 32 + l) and the qh word H (128 + 32n + l) give four words of 6-bit values
v (elements 128n + 32k + l, k = 0..3): the low or high nibbles of A or B OR-ed with a 2-bit pair of
H moved to bits 4..5. Per 16-element group (scale 8n + 2k + t): d_w sc (d_x sum(v q_x) - 32 s16_x).
Blocks are 210 bytes, so they are read in word-aligned pairs as in words.py (the odd block's words
are funnelled from two neighbours).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .words import _f16_bits, _funnel16, _k4_scales


@triton.jit
def _dp4a(a, b, ASM: tl.constexpr):
    """sum_k byte_k(a) (unsigned) * byte_k(b) (signed) as int32; ASM: the sm_61+ instruction (the
    interpreter runs the same sum on the unpacked bytes)."""
    if ASM:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, 0;", "=r,r,r", [a, b], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        acc = ((a & 255) * ((b << 24) >> 24))
        acc += ((a >> 8) & 255) * ((b << 16) >> 24)
        acc += ((a >> 16) & 255) * ((b << 8) >> 24)
        acc += ((a >> 24) & 255) * (b >> 24)
        return acc


@triton.jit
def dot_q4k_q8(p_w, row_bytes, rows, p_xq, p_ds, K, BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr):
    """(W[rows] . x_q) [BN] fp32 for Q4_K rows (16-byte aligned, BB dividing K // 256) and the
    int8 blocks of x: p_xq int8 [K], p_ds fp32 [K / 32, 4] = (d, s, s_16a, s_16b) per block.

    The payload tile is [2, BN, BB, 4, 4]: (half h, row, block, group c, word j) = word 8c + 4h + j.
    Threads are laid out from the last axis: the 16-byte vector (j), then c, blocks and rows, so
    the two halves of a group land in one thread and a sub-block's sum needs no shuffle, and the
    scales of each (row, block, group) are unpacked by one thread."""
    acc3 = tl.zeros([BN, BB, 4], dtype=tl.float32)
    bi = tl.arange(0, BB)
    c = tl.arange(0, 4)
    hj = 4 * tl.arange(0, 2)[:, None, None, None, None] + tl.arange(0, 4)[None, None, None, None, :]  # 4h + j
    p_w32 = p_w.to(tl.pointer_type(tl.int32))
    p_x32 = p_xq.to(tl.pointer_type(tl.int32))
    row_w = rows * (row_bytes // 16) * 4  # [BN] word offset of each row (16-byte aligned)
    w_in_blk = 4 + (8 * c)[None, None, None, :, None] + hj  # qs words after the 16-byte header
    xw_in_blk = (16 * c)[None, None, None, :, None] + hj  # x word of the low nibbles (word 16c + 4h + j)
    row0 = tl.zeros([1, BN, 1, 1, 1], dtype=tl.int32)  # x loaded in the tile's shape: no layout conversion
    j_lo = (2 * c)[None, None, :]
    for b0 in range(0, K // 256, BB):
        blk = b0 + bi
        p32 = p_w32 + row_w[:, None] + (blk * 36)[None, :]  # [BN, BB] block starts
        q = tl.load(p32[None, :, :, None, None] + w_in_blk)  # [2, BN, BB, 4, 4]
        w0 = tl.load(p32)
        w1 = tl.load(p32 + 1)[:, :, None]
        w2 = tl.load(p32 + 2)[:, :, None]
        w3 = tl.load(p32 + 3)[:, :, None]
        xo = (blk * 64)[None, None, :, None, None] + xw_in_blk + row0
        x_lo = tl.load(p_x32 + xo)
        x_hi = tl.load(p_x32 + xo + 8)
        s_lo = tl.sum(tl.sum(_dp4a(q & 0x0F0F0F0F, x_lo, ASM), axis=4), axis=0).to(tl.float32)  # [BN, BB, 4]
        s_hi = tl.sum(tl.sum(_dp4a((q >> 4) & 0x0F0F0F0F, x_hi, ASM), axis=4), axis=0).to(tl.float32)
        sub = (blk * 8)[:, None] + (2 * c)[None, :]  # [BB, 4] x block of sub-block 2c
        d_lo = tl.load(p_ds + 4 * sub)[None]
        s_xlo = tl.load(p_ds + 4 * sub + 1)[None]
        d_hi = tl.load(p_ds + 4 * sub + 4)[None]
        s_xhi = tl.load(p_ds + 4 * sub + 5)[None]
        sc_lo, mn_lo = _k4_scales(w1, w2, w3, j_lo)
        sc_hi, mn_hi = _k4_scales(w1, w2, w3, j_lo + 1)
        d = _f16_bits(w0)[:, :, None]
        dmin = _f16_bits(w0 >> 16)[:, :, None]
        acc3 += d * (sc_lo * s_lo * d_lo + sc_hi * s_hi * d_hi) - dmin * (mn_lo * s_xlo + mn_hi * s_xhi)
    return tl.sum(tl.sum(acc3, axis=2), axis=1)


@triton.jit
def _q6k_q8_block(p32, p_blk, blk, p_x32, p_ds, a_w, h_w, xw, sidx, xb, t2, ODD: tl.constexpr,
                  ASM: tl.constexpr):
    """[BN, BP, 2, 2] partial dots (n, t) of one block of each pair (the even or the odd one)."""
    base = p32[None, :, :, None, None]  # [1, BN, BP, 1, 1]
    if ODD:  # the odd block starts 2 bytes into word 52 of the pair
        a = _funnel16(tl.load(base + 52 + a_w), tl.load(base + 53 + a_w))
        b = _funnel16(tl.load(base + 60 + a_w), tl.load(base + 61 + a_w))
        h = _funnel16(tl.load(base + 52 + h_w), tl.load(base + 53 + h_w))
    else:
        a = tl.load(base + a_w)  # [4, BN, BP, 2, 2]: word j of group (n, t)
        b = tl.load(base + 8 + a_w)
        h = tl.load(base + h_w)
    p_sc = p_blk.to(tl.pointer_type(tl.int8))[:, :, None, None] + 192 + sidx  # [BN, BP, 2, 2]
    d = tl.load((p_blk + 208).to(tl.pointer_type(tl.float16))).to(tl.float32)[:, :, None, None]
    part = tl.zeros(p_sc.shape, dtype=tl.float32)
    for k in tl.static_range(4):
        if k == 0:
            v = (a & 0x0F0F0F0F) | ((h << 4) & 0x30303030)
        elif k == 1:
            v = (b & 0x0F0F0F0F) | ((h << 2) & 0x30303030)
        elif k == 2:
            v = ((a >> 4) & 0x0F0F0F0F) | (h & 0x30303030)
        else:
            v = ((b >> 4) & 0x0F0F0F0F) | ((h >> 2) & 0x30303030)
        x = tl.load(p_x32 + (blk * 64)[None, None, :, None, None] + xw + 8 * k)
        dot = tl.sum(_dp4a(v, x, ASM), axis=0).to(tl.float32)  # [BN, BP, 2, 2]
        sc = tl.load(p_sc + 2 * k).to(tl.float32)
        x_blk = (blk * 8)[None, :, None, None] + xb + k  # x block of group (n, k, t)
        d_x = tl.load(p_ds + 4 * x_blk)
        s16 = tl.load(p_ds + 4 * x_blk + 2 + t2)
        part += sc * (d_x * dot - 32.0 * s16)
    return d * part


@triton.jit
def dot_q6k_q8(p_w, row_bytes, rows, p_xq, p_ds, K, BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr):
    """(W[rows] . x_q) [BN] fp32 for Q6_K rows (word-aligned; BB even, dividing K // 256).

    The payload tile is [4, BN, BP, 2, 2] = (word j, row, pair, half n, group t): threads are laid
    out from the last axis, so the four words of a 16-element group stay in one thread."""
    BP: tl.constexpr = BB // 2
    acc4 = tl.zeros([BN, BP, 2, 2], dtype=tl.float32)
    jw = tl.arange(0, 4)[:, None, None, None, None]
    nn = tl.arange(0, 2)[None, None, None, :, None]
    tt = tl.arange(0, 2)[None, None, None, None, :]
    a_w = 16 * nn + 4 * tt + jw  # ql word of the low-nibble run (B = a_w + 8)
    h_w = 32 + 8 * nn + 4 * tt + jw  # qh word
    xw = 32 * nn + 4 * tt + jw + tl.zeros([1, BN, 1, 1, 1], dtype=tl.int32)  # x word of k = 0, in the tile's shape
    n2 = tl.arange(0, 2)[None, None, :, None]
    t2 = tl.arange(0, 2)[None, None, None, :]
    sidx = 8 * n2 + t2  # scale of (n, k = 0, t); k adds 2k
    xb = 4 * n2  # x block of (n, k = 0) within the block; k adds k
    p_x32 = p_xq.to(tl.pointer_type(tl.int32))
    pi = tl.arange(0, BP)
    for p0 in range(0, K // 512, BP):
        pair = p0 + pi
        p_pair = p_w + rows[:, None] * row_bytes + pair[None, :] * 420  # [BN, BP], word-aligned
        p32 = p_pair.to(tl.pointer_type(tl.int32))
        acc4 += _q6k_q8_block(p32, p_pair, 2 * pair, p_x32, p_ds, a_w, h_w, xw, sidx, xb, t2, False, ASM)
        acc4 += _q6k_q8_block(p32, p_pair + 210, 2 * pair + 1, p_x32, p_ds, a_w, h_w, xw, sidx, xb, t2, True, ASM)
    return tl.sum(tl.sum(tl.sum(acc4, axis=3), axis=2), axis=1)
