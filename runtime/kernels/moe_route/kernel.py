"""Top-k expert routing on the device, one program per token.

softmax over all E router logits, then k rounds of argmax (lowest index on ties) with the winner
masked out, weights renormalised over the k chosen (llama.cpp build_moe_ffn with norm_w; HF
norm_topk_prob). No host sync, fixed shapes: it runs inside the decode CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _route_kernel(p_logits, p_ids, p_w, E, stride_l, K: tl.constexpr, BE: tl.constexpr):
    t = tl.program_id(0)
    e = tl.arange(0, BE)
    valid = e < E
    x = tl.load(p_logits + t * stride_l + e, mask=valid, other=-float("inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = tl.where(valid, p / tl.sum(p, 0), -1.0)  # probabilities; -1 marks padding / already chosen
    total = tl.sum(tl.where(e < 0, p, 0.0), 0)  # 0.0 as a tensor of the loop-carried type
    for j in tl.static_range(K):
        best = tl.max(p, 0)
        idx = tl.min(tl.where(p == best, e, BE), 0)
        tl.store(p_ids + t * K + j, idx.to(tl.int32))
        tl.store(p_w + t * K + j, best)
        total += best
        p = tl.where(e == idx, -1.0, p)
    for j in tl.static_range(K):
        w = tl.load(p_w + t * K + j)
        tl.store(p_w + t * K + j, w / total)


def moe_route(logits: torch.Tensor, k: int, *, ids: torch.Tensor | None = None,
              weights: torch.Tensor | None = None, num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] (rows may be strided) -> (ids [T, k] int32, weights [T, k] fp32) written in place.

    num_warps: the 2k reductions a token are serial; fewer warps make each one cheaper (timed by
    bench/profiling/expert_sweep.py before any default moves)."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [T, E] with unit column stride, got {tuple(logits.shape)}")
    t, e = logits.shape
    if not 1 <= k <= e:
        raise ValueError(f"top-k {k} must lie in [1, {e}]")
    if ids is None:
        ids = torch.empty(t, k, dtype=torch.int32, device=logits.device)
    if weights is None:
        weights = torch.empty(t, k, dtype=torch.float32, device=logits.device)
    if ids.shape != (t, k) or weights.shape != (t, k) or not (ids.is_contiguous() and weights.is_contiguous()):
        raise ValueError(f"ids / weights must be contiguous [{t}, {k}]")
    if t:
        _route_kernel[(t,)](logits, ids, weights, e, logits.stride(0), K=k, BE=triton.next_power_of_2(e),
                            num_warps=num_warps)
    return ids, weights
