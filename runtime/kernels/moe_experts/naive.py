"""Pure-torch twins of the expert kernels (dequantize the chosen experts, then plain matmuls)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..qgemm.naive import dequantize_rows


def _expert(w: torch.Tensor, wtype, e: int, rows: int, cols: int) -> torch.Tensor:
    """fp32 [rows, cols] of expert e from a stack stored as [E * rows, row_bytes] (or typed [E * rows, cols])."""
    return dequantize_rows(w[e * rows : (e + 1) * rows], wtype, cols).float()


def experts_swiglu_gemv_naive(x, norm_weight, eps, gate, gate_type, up, up_type, ids, n_ff, out=None):
    """act [k, F]: silu(G_e xn) * (U_e xn) for e = ids[j], xn = RMSNorm(x) (x [d] fp32)."""
    d = x.shape[-1]
    xn = x.float() * torch.rsqrt(x.float().pow(2).mean() + eps) * norm_weight
    rows = [F.silu(_expert(gate, gate_type, e, n_ff, d) @ xn) * (_expert(up, up_type, e, n_ff, d) @ xn)
            for e in ids.tolist()]
    act = torch.stack(rows)
    if out is not None:
        out.copy_(act)
        return out
    return act


def experts_down_gemv_naive(act, down, down_type, ids, weights, residual, shared=None, shared_logit=None, out=None):
    """out [d] = residual + Σ_j w_j D_{ids[j]} act[j] (+ sigmoid(shared_logit) · shared)."""
    k, n_ff = act.shape
    d = residual.shape[-1]
    y = residual.float().clone()
    for j, e in enumerate(ids.tolist()):
        y += weights[j] * (_expert(down, down_type, e, d, n_ff) @ act[j].float())
    if shared is not None:
        y += torch.sigmoid(shared_logit.reshape(())) * shared
    if out is not None:
        out.copy_(y)
        return out
    return y


def grouped_experts_naive(x, ids, weights, gate, gate_type, up, up_type, down, down_type, n_ff):
    """Prefill twin: [T, d] -> [T, d] = Σ_j w[t, j] · expert_{ids[t, j]}(x[t]) (x already normed)."""
    t, d = x.shape
    out = torch.zeros(t, d, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        g, u, dn = _expert(gate, gate_type, e, n_ff, d), _expert(up, up_type, e, n_ff, d), _expert(down, down_type, e, d, n_ff)
        h = F.silu(xf[tok] @ g.T) * (xf[tok] @ u.T)
        out.index_add_(0, tok, (h @ dn.T) * weights[tok, slot, None])
    return out
