"""The qwen35moe FFN in plain fp32 torch (architecture reference §13; llama.cpp qwen35moe build_layer_ffn).

routed:  p = softmax(W_router x) over all experts; the top k of p, renormalised to sum 1
         (llama.cpp: build_moe_ffn(..., SILU, norm_w=true, SOFTMAX); HF Qwen3-MoE: norm_topk_prob);
         out_r = Σ_j p_j · down_j(silu(gate_j x) ⊙ up_j x)
shared:  out_s = sigmoid(w_shgate · x) · down_s(silu(gate_s x) ⊙ up_s x)
result:  out_r + out_s
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def route_ref(router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, E] logits -> (weights [T, k] renormalised, expert ids [T, k]), largest probability first."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    top, ids = torch.topk(probs, k, dim=-1)  # ties: torch's order (measure-zero for real logits)
    return top / top.sum(-1, keepdim=True), ids


def experts_ref(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]) for stacks gate/up [E, F, d], down [E, d, F]."""
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():  # token-by-expert grouping: each expert's weights once
        rows, slot = torch.nonzero(ids == e, as_tuple=True)
        xe = x[rows]
        h = F.silu(xe @ gate[e].T) * (xe @ up[e].T)
        out.index_add_(0, rows, (h @ down[e].T) * weights[rows, slot, None])
    return out


def moe_ffn_ref(f: torch.Tensor, w: dict[str, torch.Tensor], p: str, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-prefix `p`'s MoE FFN on normed input f [T, d] -> (output [T, d], chosen ids [T, k])."""
    weights, ids = route_ref(F.linear(f, w[p + "ffn_gate_inp.weight"]), k)
    routed = experts_ref(f, w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"], w[p + "ffn_down_exps.weight"],
                         weights, ids)
    hidden = F.silu(F.linear(f, w[p + "ffn_gate_shexp.weight"])) * F.linear(f, w[p + "ffn_up_shexp.weight"])
    shared = F.linear(hidden, w[p + "ffn_down_shexp.weight"])
    gate = torch.sigmoid(f @ w[p + "ffn_gate_inp_shexp.weight"])  # [T]
    return routed + shared * gate[:, None], ids
