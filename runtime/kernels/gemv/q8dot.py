"""Q4_K rows times an int8-quantized x (quant_x.Q8Vector): the GEMV's dp4a path (GemvConfig.x8).

The word-wise path (words.py) spends three instructions per weight (shift, mask-or, FFMA) and
moves fp32 x into the weight tile's layout through shared memory every K-step. Here a Q4_K
payload word (bytes 4j..4j+3 of group c) gives its four low nibbles with one AND and its high
nibbles with a shift and an AND; each meets one word of four int8 x (elements 64c + 4j + b and
64c + 32 + 4j + b are x words 16c + j and 16c + 8 + j), and dp4a does the four multiply-adds.
Per 32-element sub-block: d_w sc (sum q_w q_x) d_x - dmin mn s_x, s_x = d_x sum(q_x).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .words import _f16_bits, _k4_scales


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
    int8 blocks of x: p_xq int8 [K], p_ds fp32 [K / 32, 2] = (d, s) per block.

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
        d_lo = tl.load(p_ds + 2 * sub)[None]
        s_xlo = tl.load(p_ds + 2 * sub + 1)[None]
        d_hi = tl.load(p_ds + 2 * sub + 2)[None]
        s_xhi = tl.load(p_ds + 2 * sub + 3)[None]
        sc_lo, mn_lo = _k4_scales(w1, w2, w3, j_lo)
        sc_hi, mn_hi = _k4_scales(w1, w2, w3, j_lo + 1)
        d = _f16_bits(w0)[:, :, None]
        dmin = _f16_bits(w0 >> 16)[:, :, None]
        acc3 += d * (sc_lo * s_lo * d_lo + sc_hi * s_hi * d_hi) - dmin * (mn_lo * s_xlo + mn_hi * s_xhi)
    return tl.sum(tl.sum(acc3, axis=2), axis=1)
