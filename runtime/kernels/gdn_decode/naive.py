"""Pure-torch GDN decode step (architecture §5.3-5.7) with the same signature as the kernel."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_decode_step_naive(proj, state, ssm_a, dt_bias, norm_weight, out, *, n_k_head: int, eps: float = 1e-6,
                          num_warps=None, block_v=None, ssq=None, pdl=False):  # scheduling arguments: no effect here
    hv, dk, dv = state.shape
    ck, cv = n_k_head * dk, hv * dv
    p = proj.double()
    q = p[:ck].view(n_k_head, dk)
    k = p[ck : 2 * ck].view(n_k_head, dk)
    v = p[2 * ck : 2 * ck + cv].view(hv, dv)
    z = p[2 * ck + cv : 2 * ck + 2 * cv].view(hv, dv)
    b = p[2 * ck + 2 * cv : 2 * ck + 2 * cv + hv]
    a = p[2 * ck + 2 * cv + hv :]
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    kappa = torch.arange(hv, device=proj.device) % n_k_head  # tiled mapping
    q, k = q[kappa], k[kappa]  # [Hv, dk]
    beta = torch.sigmoid(b)
    g = ssm_a.double() * F.softplus(a + dt_bias.double())
    s = state.double() * torch.exp(g)[:, None, None]
    delta = beta[:, None] * (v - torch.einsum("hkv,hk->hv", s, k))
    s = s + k[:, :, None] * delta[:, None, :]
    o = torch.einsum("hkv,hk->hv", s, q)
    y = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + eps) * norm_weight.double() * F.silu(z)
    state.copy_(s.float())
    out.copy_(y.reshape(-1).float())
    return out
