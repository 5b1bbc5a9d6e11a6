"""Pure-torch decode attention (architecture §4) with the same signature as the kernel wrapper."""
from __future__ import annotations

import torch


def rope_half_split(x: torch.Tensor, pos: int, rope_dims: int, base: float) -> torch.Tensor:
    """Half-split RoPE on the first rope_dims dims of the last axis (pairs i, i + rope_dims/2)."""
    half = rope_dims // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) * 2 / rope_dims)
    ang = pos * inv_freq
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :half], x[..., half:rope_dims]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rope_dims:]], dim=-1)


def attention_decode_naive(proj, q_norm_w, k_norm_w, pos, k_cache, v_cache, out, ws=None, *, n_head: int,
                           n_kv_head: int, head_dim: int, rope_dims: int, rope_base: float, eps: float = 1e-6,
                           config=None, pdl=False):
    dh, p = head_dim, int(pos.item())
    x = proj.double()
    qg = x[: 2 * n_head * dh].view(n_head, 2, dh)
    q, gate = qg[:, 0], qg[:, 1]
    k = x[2 * n_head * dh : 2 * n_head * dh + n_kv_head * dh].view(n_kv_head, dh)
    v = x[2 * n_head * dh + n_kv_head * dh :].view(n_kv_head, dh)

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.double()

    q = rope_half_split(rms(q, q_norm_w), p, rope_dims, rope_base)
    k = rope_half_split(rms(k, k_norm_w), p, rope_dims, rope_base)
    k_cache[p] = k.float().to(k_cache.dtype)  # fp32 then storage dtype, as the kernel rounds
    v_cache[p] = v.float().to(v_cache.dtype)
    kk = k_cache[: p + 1].double()  # [T, Hkv, Dh]
    vv = v_cache[: p + 1].double()
    kv_of_head = torch.arange(n_head, device=proj.device) // (n_head // n_kv_head)  # ordinary GQA grouping
    s = torch.einsum("hd,thd->ht", q, kk[:, kv_of_head]) / dh**0.5
    o = torch.einsum("ht,thd->hd", torch.softmax(s, dim=-1), vv[:, kv_of_head])
    out.copy_((o * torch.sigmoid(gate)).reshape(-1).float())
    return out
