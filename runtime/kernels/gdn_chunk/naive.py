"""Gated DeltaNet core for a prefill chunk, token by token (§5.3, §5.4, §5.6) — what the chunked kernel must equal.

Inputs are the conv+SiLU output u [T, Cc] = q | k | v (head-major in each part), the raw
per-value-head projections alpha, b [T, Hv], and the GGUF vectors ssm_a (= -exp(A_log)) and
dt_bias [Hv]. Value head j reads key head j mod Hk (GGUF tiled order, §5.5).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_gates_naive(alpha, b, ssm_a, dt_bias):
    """(g, beta) [T, Hv]: g = ssm_a · softplus(alpha + dt_bias) ≤ 0, beta = σ(b)."""
    return ssm_a.float() * F.softplus(alpha.float() + dt_bias.float()), torch.sigmoid(b.float())


def split_qkv(u: torch.Tensor, n_k_head: int, n_v_head: int, head_dim: int):
    """u [T, Cc] -> L2-normalised q, k [T, Hk, dk] and v [T, Hv, dv], all fp32."""
    t, ck = u.shape[0], n_k_head * head_dim
    q = u[:, :ck].float().reshape(t, n_k_head, head_dim)
    k = u[:, ck : 2 * ck].float().reshape(t, n_k_head, head_dim)
    v = u[:, 2 * ck :].float().reshape(t, n_v_head, head_dim)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    return q, k, v


def gdn_chunk_naive(
    u: torch.Tensor, alpha: torch.Tensor, b: torch.Tensor, ssm_a: torch.Tensor, dt_bias: torch.Tensor,
    state: torch.Tensor, *, n_k_head: int,
) -> torch.Tensor:
    """o [T, Hv, dv] fp32 of the gated delta rule; `state` [Hv, dk, dv] fp32 is updated in place.

    Per value head j and token t: S <- exp(g) S; delta = beta (v - Sᵀk); S <- S + k deltaᵀ; o = Sᵀq,
    with q, k L2-normalised and q scaled by 1/sqrt(dk).
    """
    hv, dk, dv = state.shape
    q, k, v = split_qkv(u, n_k_head, hv, dk)
    g, beta = gdn_gates_naive(alpha, b, ssm_a, dt_bias)
    rep = hv // n_k_head
    q = q.repeat(1, rep, 1) * dk**-0.5  # tiled: value head j reads key head j mod Hk
    k = k.repeat(1, rep, 1)
    S = state.clone()
    out = torch.empty(u.shape[0], hv, dv, dtype=torch.float32, device=u.device)
    for t in range(u.shape[0]):
        S = S * torch.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, k[t]))
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", S, q[t])
    state.copy_(S)
    return out
