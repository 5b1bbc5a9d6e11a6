"""A decode activation quantized to int8 blocks, for the GEMV's dp4a path (GemvConfig.x8).

x_eff = x * norm weight (when the GEMV applies an RMSNorm) is cut into 32-element blocks; each
is stored as int8 q = round(x_eff * 127 / amax) with its scale d = amax / 127 and s = d * sum(q)
(what the Q4_K mins multiply), as llama.cpp's q8_1, and the same sum over each 16-element half
(what Q6_K's offset of -32 multiplies: its scales cover 16 elements). The RMSNorm's 1 / rms is one scalar for the
whole vector, so it is not folded into q: the GEMV multiplies its dot products by `rstd` after.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

QBLOCK = 32  # elements per int8 block: one Q4_K sub-block, so each meets a single x scale
BLOCK_ELEMS = 1024  # elements per program


@dataclass(frozen=True)
class Q8Vector:
    """Preallocated output of quantize_x for vectors of up to `capacity` elements (static
    addresses: the decode step's CUDA graph reuses one for every GEMV input)."""

    q: torch.Tensor  # int8 [capacity]
    ds: torch.Tensor  # fp32 [capacity / 32, 4]: (d, s, s of elements 0..15, s of 16..31) per block
    rstd: torch.Tensor  # fp32 [1]: 1 / rms(x) when quantized with a norm weight, else 1

    @classmethod
    def empty(cls, capacity: int, device) -> "Q8Vector":
        if capacity % QBLOCK:
            raise ValueError(f"Q8Vector: capacity {capacity} is not a multiple of {QBLOCK}")
        return cls(torch.zeros(capacity, dtype=torch.int8, device=device),
                   torch.zeros(capacity // QBLOCK, 4, dtype=torch.float32, device=device),
                   torch.ones(1, dtype=torch.float32, device=device))

    @property
    def capacity(self) -> int:
        return self.q.shape[0]


@triton.jit
def _quantize_kernel(p_x, p_nw, p_q, p_ds, p_rstd, K, eps, NORM: tl.constexpr, BLK: tl.constexpr):
    pid = tl.program_id(0)
    blk = pid * (BLK // 32) + tl.arange(0, BLK // 32)  # [BLK/32] block index
    offs = blk[:, None] * 32 + tl.arange(0, 32)[None, :]
    m = offs < K
    x = tl.load(p_x + offs, mask=m, other=0.0)
    if NORM:
        x = x * tl.load(p_nw + offs, mask=m, other=0.0)
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, 127.0 / tl.maximum(amax, 1e-30), 0.0)
    v = x * inv[:, None]
    q = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(0.5 - v))  # round half away from zero, |q| <= 127
    tl.store(p_q + offs, q.to(tl.int8), mask=m)
    d = amax / 127.0
    bm = blk < K // 32
    first = tl.arange(0, 32)[None, :] < 16
    s_a = tl.sum(tl.where(first, q, 0.0), axis=1)
    s_b = tl.sum(tl.where(first, 0.0, q), axis=1)
    tl.store(p_ds + 4 * blk, d, mask=bm)
    tl.store(p_ds + 4 * blk + 1, d * (s_a + s_b), mask=bm)
    tl.store(p_ds + 4 * blk + 2, d * s_a, mask=bm)
    tl.store(p_ds + 4 * blk + 3, d * s_b, mask=bm)
    if pid == 0:  # 1 / rms over the whole raw x (one program: K is a few thousand)
        if NORM:
            ss = tl.zeros([BLK], dtype=tl.float32)
            for k0 in range(0, K, BLK):
                o = k0 + tl.arange(0, BLK)
                xr = tl.load(p_x + o, mask=o < K, other=0.0)
                ss += xr * xr
            tl.store(p_rstd, tl.rsqrt(tl.sum(ss, axis=0) / K + eps))
        else:
            tl.store(p_rstd, 1.0)


def quantize_x(x: torch.Tensor, out: Q8Vector, norm_weight: torch.Tensor | None = None, eps: float = 1e-6) -> Q8Vector:
    """Quantize fp32 x [K] (times norm_weight, if given) into `out`'s first K elements."""
    K = x.shape[0]
    if x.dtype != torch.float32 or x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"quantize_x: x must be a contiguous fp32 vector, got {tuple(x.shape)} {x.dtype}")
    if K % QBLOCK or K > out.capacity:
        raise ValueError(f"quantize_x: K={K} must be a multiple of {QBLOCK} and at most {out.capacity}")
    if norm_weight is not None and (norm_weight.shape != (K,) or norm_weight.dtype != torch.float32):
        raise ValueError(f"quantize_x: norm_weight must be fp32 [{K}], got {tuple(norm_weight.shape)} {norm_weight.dtype}")
    _quantize_kernel[(triton.cdiv(K, BLOCK_ELEMS),)](
        x, norm_weight if norm_weight is not None else x, out.q, out.ds, out.rstd, K, float(eps),
        NORM=norm_weight is not None, BLK=BLOCK_ELEMS, num_warps=4)
    return out
