"""Vectorised torch dequantizers for the ggml types the runtime reads.

Each one works on a [n_blocks, bytes_per_block] uint8 tensor on any device and performs
the same float32 operations, in the same order, as `gguf.quants.dequantize` (and
llama.cpp's `dequantize_row_*`), so results agree bit for bit.
Block layouts: architecture reference §8.4, ggml-common.h.
"""
from __future__ import annotations

import warnings
from math import prod

import numpy as np
import torch

from ..gguf.types import BLOCK, GGMLType

QK_K = 256


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The little-endian fp16 at byte `start` of every block, as fp32 [n_blocks, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack Q4_K/Q5_K's 12 scale bytes into eight 6-bit scales and eight 6-bit mins (uint8)."""
    s = scales.view(-1, 3, 4)
    lo, mid, hi = s[:, 0], s[:, 1], s[:, 2]  # bytes 0-3, 4-7, 8-11
    sc = torch.cat([lo & 63, (hi & 15) | ((lo >> 6) << 4)], dim=1)
    mn = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], dim=1)
    return sc, mn


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b, 0)
    return b[:, 2:].view(torch.int8).float() * d


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = k_scale_min(b[:, 4:16])
    dl = (d * sc.float()).view(n, 8, 1)
    ml = (dmin * mn.float()).view(n, 8, 1)
    qs = b[:, 16:144].view(n, 4, 1, 32)
    q = torch.cat([qs & 15, qs >> 4], dim=2).view(n, 8, 32).float()  # sub-block 2c: low nibbles, 2c+1: high
    return (dl * q - ml).view(n, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = k_scale_min(b[:, 4:16])
    dl = (d * sc.float()).view(n, 8, 1)
    ml = (dmin * mn.float()).view(n, 8, 1)
    qh = b[:, 16:48].view(n, 1, 32)
    qs = b[:, 48:176].view(n, 4, 1, 32)
    low = torch.cat([qs & 15, qs >> 4], dim=2).view(n, 8, 32)
    shifts = torch.arange(8, device=b.device, dtype=torch.uint8).view(1, 8, 1)
    high = (qh >> shifts) & 1  # bit j of qh[l] is the 5th bit of sub-block j
    q = (low | (high << 4)).float()
    return (dl * q - ml).view(n, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = b[:, 0:128].view(n, 2, 1, 64)  # per half of 128: 64 bytes
    qh = b[:, 128:192].view(n, 2, 1, 32)  # per half: 32 bytes
    scales = b[:, 192:208].view(torch.int8).float()
    d = _f16(b, 208)
    low = torch.cat([ql & 15, ql >> 4], dim=2).view(n, 2, 4, 32)  # elements l, l+32, l+64, l+96
    shifts = torch.tensor([0, 2, 4, 6], device=b.device, dtype=torch.uint8).view(1, 1, 4, 1)
    high = (qh >> shifts) & 3
    q = ((low | (high << 4)).to(torch.int8) - 32).float().view(n, 16, 16)
    return ((d * scales).view(n, 16, 1) * q).view(n, QK_K)


def _f32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def _f16_plain(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _bf16(b: torch.Tensor) -> torch.Tensor:
    return (b.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)


_DEQUANT = {
    GGMLType.F32: _f32,
    GGMLType.F16: _f16_plain,
    GGMLType.BF16: _bf16,
    GGMLType.Q8_0: _q8_0,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
}


def _as_uint8_tensor(raw) -> torch.Tensor:
    if isinstance(raw, torch.Tensor):
        t = raw
        if t.dtype != torch.uint8:
            t = t.contiguous().view(torch.uint8)
        return t.reshape(-1)
    arr = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    with warnings.catch_warnings():  # read-only memmaps: we never write to the input
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def dequantize_bytes(raw, ggml_type, shape, device="cpu") -> torch.Tensor:
    """fp32 tensor of `shape` (torch order, rows = last dim) from raw ggml bytes.

    `raw` is a uint8 torch tensor or any numpy array holding the tensor's bytes.
    """
    gtype = GGMLType(int(ggml_type))
    if gtype not in _DEQUANT:
        raise ValueError(f"no dequantizer for ggml type {gtype.name}")
    shape = tuple(int(s) for s in shape)
    per_block, block_bytes = BLOCK[gtype]
    if not shape or shape[-1] % per_block:
        raise ValueError(f"row length {shape[-1] if shape else None} is not a multiple of the {gtype.name} block size {per_block}")
    n_blocks = prod(shape) // per_block
    data = _as_uint8_tensor(raw)
    if data.numel() != n_blocks * block_bytes:
        raise ValueError(
            f"{gtype.name} tensor of shape {list(shape)} needs {n_blocks * block_bytes} bytes, got {data.numel()}"
        )
    blocks = data.to(device).view(n_blocks, block_bytes)
    return _DEQUANT[gtype](blocks).reshape(shape)


def dequantize(qtensor, device="cpu") -> torch.Tensor:
    """fp32 torch tensor of `qtensor.shape` on `device` (qtensor: runtime.gguf.QTensor)."""
    return dequantize_bytes(qtensor.data, qtensor.type, qtensor.shape, device)
