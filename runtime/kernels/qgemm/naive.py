"""Pure-torch dequantization of raw GGUF block rows and the GEMM the Triton kernel must equal.

Weights are stored as GGUF bytes on the device: uint8 [rows, row_bytes] for block types
(architecture reference §8.4), or a typed [rows, cols] tensor for F32/F16/BF16.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...gguf.types import BLOCK, GGMLType

DENSE_TYPES = {GGMLType.F32: torch.float32, GGMLType.F16: torch.float16, GGMLType.BF16: torch.bfloat16}


def row_bytes(wtype: GGMLType, k: int) -> int:
    per_block, nbytes = BLOCK[GGMLType(wtype)]
    if k % per_block:
        raise ValueError(f"row length {k} is not a multiple of the {GGMLType(wtype).name} block size {per_block}")
    return k // per_block * nbytes


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] fp32 (little-endian IEEE half)."""
    return b.contiguous().view(torch.float16)[..., 0].float()


def _q4k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 packed bytes [..., 12] -> 6-bit scales and mins [..., 8] (sub-block order)."""
    s = s.to(torch.int32)
    lo_sc, lo_m = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    hi_m = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return torch.cat([lo_sc, hi_sc], -1).float(), torch.cat([lo_m, hi_m], -1).float()


def dequantize_rows(w: torch.Tensor, wtype: GGMLType, k: int) -> torch.Tensor:
    """fp32 [rows, k] from raw GGUF rows `w` (uint8 [rows, row_bytes], or a typed dense tensor)."""
    wtype = GGMLType(wtype)
    if wtype in DENSE_TYPES:
        return w.float().reshape(w.shape[0], k)
    n = w.shape[0]
    per_block, nbytes = BLOCK[wtype]
    b = w.reshape(n, k // per_block, nbytes)
    if wtype == GGMLType.Q8_0:
        return (_f16(b[..., 0:2])[..., None] * b[..., 2:].view(torch.int8).float()).reshape(n, k)
    if wtype in (GGMLType.Q4_K, GGMLType.Q5_K):
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, m = _q4k_scales(b[..., 4:16])  # [n, nb, 8]
        qs = b[..., 16:144] if wtype == GGMLType.Q4_K else b[..., 48:176]
        qs = qs.to(torch.int32).reshape(n, -1, 4, 1, 32)
        q = torch.cat([qs & 15, qs >> 4], dim=3)  # [n, nb, group c, half h, 32]: sub-block 2c+h
        if wtype == GGMLType.Q5_K:
            qh = b[..., 16:48].to(torch.int32).reshape(n, -1, 1, 1, 32)
            bit = torch.arange(8, device=w.device, dtype=torch.int32).reshape(1, 1, 4, 2, 1)
            q = q + 16 * ((qh >> bit) & 1)
        q = q.reshape(n, -1, 8, 32).float()
        return (d[..., None, None] * sc[..., None] * q - dmin[..., None, None] * m[..., None]).reshape(n, k)
    if wtype == GGMLType.Q6_K:
        ql = b[..., 0:128].to(torch.int32).reshape(n, -1, 2, 1, 2, 32)  # [half, ., ql' or ql'+32, l]
        qh = b[..., 128:192].to(torch.int32).reshape(n, -1, 2, 1, 1, 32)
        sc = b[..., 192:208].view(torch.int8).float().reshape(n, -1, 2, 4, 2, 1)  # 8n + 2*quarter + l//16
        d = _f16(b[..., 208:210])
        nib = torch.cat([ql & 15, ql >> 4], dim=3)  # [n, nb, half, nibble, which, 32]: quarter = 2*nibble + which
        shift = 2 * torch.arange(4, device=w.device, dtype=torch.int32).reshape(1, 1, 1, 2, 2, 1)
        q = (nib | (((qh >> shift) & 3) << 4)) - 32
        q = q.reshape(n, -1, 2, 4, 2, 16).float()
        return (d[..., None, None, None, None] * sc * q).reshape(n, k)
    raise ValueError(f"unsupported weight type {wtype.name}")


def gather_rows_naive(w: torch.Tensor, wtype: GGMLType, ids: torch.Tensor, k: int) -> torch.Tensor:
    """fp32 [T, k] = dequantized rows ids of w (the embedding lookup, §6: no scaling)."""
    return dequantize_rows(w[ids.long()], wtype, k)


def qgemm_naive(
    x: torch.Tensor, w: torch.Tensor, wtype: GGMLType, k: int, *, out_dtype=torch.float32, residual=None
) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(w)ᵀ (+ residual), computed in fp32 from bf16-rounded x and weights."""
    wd = dequantize_rows(w, wtype, k).to(torch.bfloat16).float()
    y = x.to(torch.bfloat16).float() @ wd.t()
    if residual is not None:
        y = y + residual.float()
    return y.to(out_dtype)


def qgemm_swiglu_naive(
    x: torch.Tensor, w_gate: torch.Tensor, gate_type: GGMLType, w_up: torch.Tensor, up_type: GGMLType, k: int
) -> torch.Tensor:
    """SiLU(x W_gateᵀ) ⊙ (x W_upᵀ) as bf16 [M, F] (the FFN's input to ffn_down)."""
    g = qgemm_naive(x, w_gate, gate_type, k)
    u = qgemm_naive(x, w_up, up_type, k)
    return (F.silu(g) * u).to(torch.bfloat16)


def random_qweight(n: int, k: int, wtype: GGMLType, *, device="cpu", generator=None, scale: float = 0.02) -> torch.Tensor:
    """Random valid GGUF rows for tests and benches: random quant bytes, small finite f16 scales.

    Dense types give a typed [n, k] tensor of N(0, scale²) values.
    """
    wtype = GGMLType(wtype)
    if wtype in DENSE_TYPES:
        return (torch.randn(n, k, generator=generator) * scale).to(DENSE_TYPES[wtype]).to(device)
    per_block, nbytes = BLOCK[wtype]
    nb = k // per_block
    b = torch.randint(0, 256, (n, row_bytes(wtype, k)), dtype=torch.uint8, generator=generator).reshape(n, nb, nbytes)

    def put_f16(off: int, mag: float) -> None:
        v = (torch.rand(n, nb, generator=generator) * 0.5 + 0.5) * mag
        b[..., off : off + 2] = v.to(torch.float16).view(torch.uint8).reshape(n, nb, 2)

    # Magnitudes chosen so dequantized weights are ~`scale`: q spans ~±8 (Q4/Q5), ±32 (Q6), ±128 (Q8).
    if wtype == GGMLType.Q8_0:
        put_f16(0, scale / 64)
    elif wtype in (GGMLType.Q4_K, GGMLType.Q5_K):
        put_f16(0, scale / 64)
        put_f16(2, scale / 64)
    elif wtype == GGMLType.Q6_K:
        put_f16(208, scale / 512)
    return b.reshape(n, -1).to(device)
