"""Pure-torch references for the gated-attention ops and RMSNorm (architecture reference §3.1, §4).

Token-major layout, one sequence: q [Tq, Hq, Dh], k and v [Tk, Hkv, Dh]. Computed in the
dtype of the inputs; kernels must match these.
"""
from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim. GGUF weights already hold 1 + w."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rope_cos_sin(
    positions: torch.Tensor, rope_dims: int, base: float, dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rope_dims/2] of theta_i(p) = p * base^(-2i/rope_dims).

    Frequencies are computed in fp64 then cast, so every backend can reproduce them exactly.
    """
    half = rope_dims // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64, device=positions.device) * 2.0 / rope_dims)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split (NeoX) rotary on the first 2*half dims of each head; the rest passes through.

    x [T, H, D]; cos, sin [T, half]. Element i pairs with element i + half.
    """
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


def attention_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None, q_block: int = 512
) -> torch.Tensor:
    """Causal GQA softmax attention of Tq new queries over Tk >= Tq cached keys.

    Query i sits at position Tk - Tq + i and sees keys 0 .. Tk - Tq + i. Query head h reads
    KV head h // (Hq/Hkv). Scale defaults to 1/sqrt(Dh). Returns [Tq, Hq, Dh]. Queries are
    processed `q_block` rows at a time so the score matrix stays small for long prompts.
    """
    Tq, hq, dh = q.shape
    Tk, hkv, _ = k.shape
    if v.shape != k.shape or k.shape[2] != dh:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: head dims disagree")
    if Tk < Tq:
        raise ValueError(f"{Tq} queries but only {Tk} keys (the cache must include the new tokens)")
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    scale = dh**-0.5 if scale is None else scale
    group = hq // hkv
    k_t = k.permute(1, 2, 0)[:, None]  # [Hkv, 1, Dh, Tk]
    v_h = v.transpose(0, 1)[:, None]  # [Hkv, 1, Tk, Dh]
    key_pos = torch.arange(Tk, device=q.device)
    out = q.new_empty(Tq, hq, dh)
    for b0 in range(0, Tq, q_block):
        b1 = min(b0 + q_block, Tq)
        # [Hkv, G, n, Dh] x [Hkv, 1, Dh, Tk] -> [Hkv, G, n, Tk]: batched over KV heads, no copies of K/V
        qh = q[b0:b1].transpose(0, 1).reshape(hkv, group, b1 - b0, dh)
        scores = torch.matmul(qh, k_t) * scale
        q_pos = torch.arange(Tk - Tq + b0, Tk - Tq + b1, device=q.device)
        scores = scores.masked_fill(key_pos[None, :] > q_pos[:, None], float("-inf"))  # future keys
        probs = torch.softmax(scores, dim=-1)
        out[b0:b1] = torch.matmul(probs, v_h).reshape(hq, b1 - b0, dh).transpose(0, 1)
    return out
