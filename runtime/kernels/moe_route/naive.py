"""Pure-torch twin of the router kernel: softmax over all experts, top-k, renormalised."""
from __future__ import annotations

import torch


def moe_route_naive(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (ids [T, k] int32, weights [T, k] fp32), most probable first."""
    probs = torch.softmax(logits.float(), dim=-1)
    top, ids = torch.topk(probs, k, dim=-1)
    return ids.to(torch.int32), top / top.sum(-1, keepdim=True)
