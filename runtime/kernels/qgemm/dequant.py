"""Triton helpers that dequantize [BN rows, 64 columns] of raw GGUF block rows to fp32, as two
[BN, 32] halves.

Shared by the prefill GEMM and the embedding-row gather. `k0` is the first column and a
multiple of 64, so a tile never straddles a K-quant super-block (256) and covers exactly two
Q8_0 blocks. Layouts: architecture reference §8.4.
"""
import triton
import triton.language as tl

# ggml type ids (runtime.gguf.types.GGMLType)
T_F32 = tl.constexpr(0)
T_F16 = tl.constexpr(1)
T_Q8_0 = tl.constexpr(8)
T_Q4_K = tl.constexpr(12)
T_Q5_K = tl.constexpr(13)
T_Q6_K = tl.constexpr(14)
T_BF16 = tl.constexpr(30)

TILE_K = 64  # columns per dequantized tile (python-side constant)


@triton.jit
def _f16_at(p, mask):
    return tl.load(p.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _q4k_scale_min(p_scales, j, mask):
    """6-bit scale and min of sub-block j (runtime scalar 0..7) for each row: [BN] fp32 each."""
    lo = j < 4
    b_j = tl.load(p_scales + j, mask=mask, other=0).to(tl.int32)
    b_j4 = tl.load(p_scales + j + 4, mask=mask, other=0).to(tl.int32)
    b_jm4 = tl.load(p_scales + tl.where(lo, j, j - 4), mask=mask, other=0).to(tl.int32)
    sc = tl.where(lo, b_j & 63, (b_j4 & 15) | ((b_jm4 >> 6) << 4))
    mn = tl.where(lo, b_j4 & 63, (b_j4 >> 4) | ((b_j >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def dequant_pair(p_w, stride_w, offs_n, mask_n, k0, K, WTYPE: tl.constexpr):
    """Two fp32 [BN, 32] tiles: columns k0 … k0+31 and k0+32 … k0+63 of rows offs_n (k0 % 64 == 0).

    Split in halves of 32 because every supported block type packs its 64 weights that way
    (Q4_K/Q5_K: low and high nibbles of the same 32 bytes; Q6_K: two quarters sharing qh;
    Q8_0: two blocks), so each byte is loaded once, contiguously. p_w points to uint8 rows of
    `stride_w` bytes (block types) or to typed rows of `stride_w` elements (F32/F16/BF16).
    Masked rows read as 0.
    """
    l = tl.arange(0, 32)
    m2 = mask_n[:, None]
    if WTYPE == T_F32 or WTYPE == T_F16 or WTYPE == T_BF16:
        p_row = p_w + offs_n[:, None].to(tl.int64) * stride_w + k0 + l[None, :]
        lo = tl.load(p_row, mask=m2 & ((k0 + l) < K)[None, :], other=0.0).to(tl.float32)
        hi = tl.load(p_row + 32, mask=m2 & ((k0 + 32 + l) < K)[None, :], other=0.0).to(tl.float32)
    elif WTYPE == T_Q8_0:  # 34-byte blocks: f16 d, int8 qs[32]
        p_blk = p_w + offs_n.to(tl.int64) * stride_w + (k0 // 32) * 34  # [BN]
        p_q = (p_blk[:, None] + 2 + l[None, :]).to(tl.pointer_type(tl.int8))
        lo = tl.load(p_q, mask=m2, other=0).to(tl.float32) * _f16_at(p_blk, mask_n)[:, None]
        hi = tl.load(p_q + 34, mask=m2, other=0).to(tl.float32) * _f16_at(p_blk + 34, mask_n)[:, None]
    elif WTYPE == T_Q4_K or WTYPE == T_Q5_K:
        NB = 144 + 32 * (WTYPE == T_Q5_K)  # block bytes
        QS = 16 + 32 * (WTYPE == T_Q5_K)  # offset of qs: Q5_K has qh[32] before it
        c = (k0 % 256) // 64  # group of 64 = sub-blocks 2c (low nibbles) and 2c+1 (high)
        p_blk = p_w + offs_n.to(tl.int64) * stride_w + (k0 // 256) * NB  # [BN]
        d = _f16_at(p_blk, mask_n)
        dmin = _f16_at(p_blk + 2, mask_n)
        sc0, m0 = _q4k_scale_min(p_blk + 4, 2 * c, mask_n)
        sc1, m1 = _q4k_scale_min(p_blk + 4, 2 * c + 1, mask_n)
        byte = tl.load(p_blk[:, None] + QS + 32 * c + l[None, :], mask=m2, other=0).to(tl.int32)
        q_lo = byte & 15
        q_hi = byte >> 4
        if WTYPE == T_Q5_K:
            qh = tl.load(p_blk[:, None] + 16 + l[None, :], mask=m2, other=0).to(tl.int32)
            q_lo += ((qh >> (2 * c)) & 1) << 4
            q_hi += ((qh >> (2 * c + 1)) & 1) << 4
        lo = q_lo.to(tl.float32) * (d * sc0)[:, None] - (dmin * m0)[:, None]
        hi = q_hi.to(tl.float32) * (d * sc1)[:, None] - (dmin * m1)[:, None]
    else:  # Q6_K, 210-byte blocks: ql[128] qh[64] int8 scales[16] f16 d
        half = (k0 % 256) // 128
        qa = (k0 % 128) // 32  # first quarter of this tile: 0 or 2 (the second is qa + 1)
        shift = 4 * (qa // 2)  # quarters 0,1 use low nibbles, 2,3 high nibbles
        p_blk = p_w + offs_n.to(tl.int64) * stride_w + (k0 // 256) * 210  # [BN]
        p_ql = p_blk[:, None] + 64 * half + l[None, :]
        ql_a = tl.load(p_ql, mask=m2, other=0).to(tl.int32)
        ql_b = tl.load(p_ql + 32, mask=m2, other=0).to(tl.int32)
        qh = tl.load(p_blk[:, None] + 128 + 32 * half + l[None, :], mask=m2, other=0).to(tl.int32)
        q_a = ((ql_a >> shift) & 15) | (((qh >> (2 * qa)) & 3) << 4)
        q_b = ((ql_b >> shift) & 15) | (((qh >> (2 * qa + 2)) & 3) << 4)
        p_sc = (p_blk + 192 + 8 * half + 2 * qa).to(tl.pointer_type(tl.int8))  # scales of 16 weights each
        d = _f16_at(p_blk + 208, mask_n)
        s_a0 = tl.load(p_sc, mask=mask_n, other=0).to(tl.float32) * d
        s_a1 = tl.load(p_sc + 1, mask=mask_n, other=0).to(tl.float32) * d
        s_b0 = tl.load(p_sc + 2, mask=mask_n, other=0).to(tl.float32) * d
        s_b1 = tl.load(p_sc + 3, mask=mask_n, other=0).to(tl.float32) * d
        first = (l < 16)[None, :]
        lo = (q_a - 32).to(tl.float32) * tl.where(first, s_a0[:, None], s_a1[:, None])
        hi = (q_b - 32).to(tl.float32) * tl.where(first, s_b0[:, None], s_b1[:, None])
    return lo, hi
