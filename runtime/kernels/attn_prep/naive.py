"""Gated-attention inputs for a prefill chunk (§4.1–4.5): split q|gate, q/k RMSNorm, partial half-split
RoPE, and the KV-cache write (K after norm + RoPE, V raw)."""
from __future__ import annotations

import torch


def rope_tables(positions: torch.Tensor, rope_dims: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin fp32 [T, rope_dims/2] of θ_i(p) = p · base^(−2i/rope_dims), computed in fp64."""
    half = rope_dims // 2
    inv = base ** (-torch.arange(half, dtype=torch.float64, device=positions.device) * 2.0 / rope_dims)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def _norm_rope(x, w, cos, sin, eps):
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    half = cos.shape[1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


def attn_prep_naive(
    qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos0: int, eps: float,
) -> torch.Tensor:
    """qg [T, 2·Hq·Dh] (per head [q | gate]), k, v [T, Hkv·Dh]; caches [ctx, Hkv, Dh].

    Writes k_cache/v_cache rows pos0 … pos0+T-1 and returns q (normed, roped) bf16 [T, Hq, Dh].
    """
    t = qg.shape[0]
    _, hkv, dh = k_cache.shape
    hq = qg.shape[1] // (2 * dh)
    q = qg.reshape(t, hq, 2 * dh)[..., :dh]
    k_cache[pos0 : pos0 + t] = _norm_rope(k.reshape(t, hkv, dh), k_norm, cos, sin, eps).to(k_cache.dtype)
    v_cache[pos0 : pos0 + t] = v.reshape(t, hkv, dh).to(v_cache.dtype)
    return _norm_rope(q, q_norm, cos, sin, eps).to(torch.bfloat16)
