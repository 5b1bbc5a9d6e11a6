"""Causal GQA softmax attention of a prefill chunk over the KV cache, with the sigmoid output gate (§4.4)."""
from __future__ import annotations

import torch


def flash_attn_naive(q: torch.Tensor, qg: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos0: int) -> torch.Tensor:
    """q [T, Hq, Dh] (normed + roped) at positions pos0 …; cache rows 0 … pos0+T-1 valid.

    Query head h reads KV head h // (Hq/Hkv); scale 1/sqrt(Dh); output ⊙ σ(gate) where gate is
    the second half of each head's slice of qg [T, 2·Hq·Dh]. Returns bf16 [T, Hq·Dh].
    """
    t, hq, dh = q.shape
    hkv = k_cache.shape[1]
    n = pos0 + t
    k = k_cache[:n].float().repeat_interleave(hq // hkv, dim=1)  # [n, Hq, Dh]
    v = v_cache[:n].float().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("thd,nhd->htn", q.float(), k) * dh**-0.5
    future = torch.arange(n, device=q.device)[None, :] > (pos0 + torch.arange(t, device=q.device))[:, None]
    p = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)
    o = torch.einsum("htn,nhd->thd", p, v)
    gate = qg.reshape(t, hq, 2 * dh)[..., dh:].float()
    return (o * torch.sigmoid(gate)).reshape(t, hq * dh).to(torch.bfloat16)
