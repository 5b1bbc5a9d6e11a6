"""Triton helpers that dequantize a [BN rows, 64 columns] tile of raw GGUF block rows to fp32.

Shared by the prefill GEMM and the embedding-row gather. `k0` is the first column of the
tile and a multiple of 64, so a tile never straddles a K-quant super-block (256) and
covers exactly two Q8_0 blocks. Layouts: architecture reference §8.4.
"""
import triton
import triton.language as tl

# ggml type ids (runtime.gguf.types.GGMLType)
T_F32: tl.constexpr = 0
T_F16: tl.constexpr = 1
T_Q8_0: tl.constexpr = 8
T_Q4_K: tl.constexpr = 12
T_Q5_K: tl.constexpr = 13
T_Q6_K: tl.constexpr = 14
T_BF16: tl.constexpr = 30

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
def dequant_tile(p_w, stride_w, offs_n, mask_n, k0, K, WTYPE: tl.constexpr, BK: tl.constexpr):
    """fp32 [BN, BK] = dequantized weights rows offs_n, columns k0 .. k0+BK (BK == 64 for block types).

    p_w points to uint8 rows of `stride_w` bytes (block types) or to typed rows of `stride_w`
    elements (F32/F16/BF16). Masked rows read as 0.
    """
    e = tl.arange(0, BK)
    m2 = mask_n[:, None]
    if WTYPE == T_F32 or WTYPE == T_F16 or WTYPE == T_BF16:
        cols = k0 + e
        ptr = p_w + offs_n[:, None].to(tl.int64) * stride_w + cols[None, :]
        w = tl.load(ptr, mask=m2 & (cols[None, :] < K), other=0.0).to(tl.float32)
    elif WTYPE == T_Q8_0:
        col = k0 + e
        p_blk = p_w + offs_n[:, None].to(tl.int64) * stride_w + (col // 32 * 34)[None, :]
        q = tl.load((p_blk + 2 + (col % 32)[None, :]).to(tl.pointer_type(tl.int8)), mask=m2, other=0)
        w = q.to(tl.float32) * _f16_at(p_blk, m2)
    elif WTYPE == T_Q4_K or WTYPE == T_Q5_K:
        NB: tl.constexpr = 144 if WTYPE == T_Q4_K else 176
        QS: tl.constexpr = 16 if WTYPE == T_Q4_K else 48
        c = (k0 % 256) // 64  # group of 64 = sub-blocks 2c (low nibbles) and 2c+1 (high)
        p_blk = p_w + offs_n.to(tl.int64) * stride_w + (k0 // 256) * NB  # [BN]
        d = _f16_at(p_blk, mask_n)
        dmin = _f16_at(p_blk + 2, mask_n)
        sc0, m0 = _q4k_scale_min(p_blk + 4, 2 * c, mask_n)
        sc1, m1 = _q4k_scale_min(p_blk + 4, 2 * c + 1, mask_n)
        hi = (e >= 32)[None, :]
        byte = tl.load(p_blk[:, None] + QS + 32 * c + (e % 32)[None, :], mask=m2, other=0).to(tl.int32)
        q = (byte >> (4 * (e // 32))[None, :]) & 15
        if WTYPE == T_Q5_K:
            qh = tl.load(p_blk[:, None] + 16 + (e % 32)[None, :], mask=m2, other=0).to(tl.int32)
            q += ((qh >> (2 * c + e // 32)[None, :]) & 1) << 4
        scale = tl.where(hi, (d * sc1)[:, None], (d * sc0)[:, None])
        offset = tl.where(hi, (dmin * m1)[:, None], (dmin * m0)[:, None])
        w = q.to(tl.float32) * scale - offset
    else:  # Q6_K: 210-byte blocks ql[128] qh[64] scales[16] d
        half = (k0 % 256) // 128
        r = (k0 % 128) + e  # position inside the half, 0..127
        quarter = r // 32
        lpos = r % 32
        p_blk = p_w + offs_n[:, None].to(tl.int64) * stride_w + (k0 // 256) * 210 + 0 * e[None, :]
        ql = tl.load(p_blk + 64 * half + (r % 64)[None, :], mask=m2, other=0).to(tl.int32)
        qh = tl.load(p_blk + 128 + 32 * half + lpos[None, :], mask=m2, other=0).to(tl.int32)
        q = ((ql >> (4 * (r // 64))[None, :]) & 15) | (((qh >> (2 * quarter)[None, :]) & 3) << 4)
        sc = tl.load((p_blk + 192 + 8 * half + (2 * quarter + lpos // 16)[None, :]).to(tl.pointer_type(tl.int8)),
                     mask=m2, other=0)
        d = _f16_at(p_w + offs_n.to(tl.int64) * stride_w + (k0 // 256) * 210 + 208, mask_n)
        w = (q - 32).to(tl.float32) * sc.to(tl.float32) * d[:, None]
    return w
