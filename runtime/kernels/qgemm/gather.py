"""Gather-and-dequantize embedding rows by token id (the same tile dequantizer as the GEMM).

The prefill embedding lookup; equals dequantize_rows(w[ids]) (qgemm.naive)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dequant import TILE_K, dequant_pair
from .kernel import _check_weight


@triton.jit
def _embed_kernel(p_w, p_ids, p_y, T, V, K, stride_w, stride_y, WTYPE: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                  ALL_ROWS: tl.constexpr):
    i_t, i_k = tl.program_id(0), tl.program_id(1)
    rows = i_t * BT + tl.arange(0, BT)
    valid = rows < T
    if ALL_ROWS:  # dequantize the whole matrix, row i -> output row i
        ids = rows
    else:
        ids = tl.load(p_ids + rows, mask=valid, other=0)
    ok = valid & (ids >= 0) & (ids < V)
    w0, w1 = dequant_pair(p_w, stride_w, ids, ok, i_k * BK, K, WTYPE)
    cols = i_k * BK + tl.arange(0, BK // 2)
    p_row = p_y + rows[:, None].to(tl.int64) * stride_y + cols[None, :]
    tl.store(p_row, w0.to(p_y.dtype.element_ty), mask=valid[:, None] & (cols < K)[None, :])
    tl.store(p_row + BK // 2, w1.to(p_y.dtype.element_ty), mask=valid[:, None] & (cols + BK // 2 < K)[None, :])


def gather_rows(w: torch.Tensor, wtype, ids: torch.Tensor, d: int, *, out: torch.Tensor | None = None,
                ids_checked: bool = False) -> torch.Tensor:
    """fp32 [T, d] = dequantize_rows(w[ids]); ids must lie in [0, V) (checked on the host, a sync,
    unless the caller says it checked them: a captured CUDA graph cannot sync)."""
    wtype = _check_weight(w, wtype, d, "token_embd")
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got {tuple(ids.shape)}")
    t, v = ids.shape[0], w.shape[0]
    if out is None:
        out = torch.empty(t, d, dtype=torch.float32, device=w.device)
    if out.shape != (t, d) or out.stride(1) != 1:
        raise ValueError(f"out must be [{t}, {d}], got {tuple(out.shape)}")
    if t == 0:
        return out
    ids = ids.to(device=w.device, dtype=torch.int32)
    if not ids_checked:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= v:
            raise ValueError(f"token ids must lie in [0, {v}), got min {lo} max {hi}")
    bt = 16
    _embed_kernel[(triton.cdiv(t, bt), triton.cdiv(d, TILE_K))](
        w, ids, out, t, v, d, w.stride(0), out.stride(0), WTYPE=int(wtype), BT=bt, BK=TILE_K, ALL_ROWS=False, num_warps=4)
    return out


def dequantize_matrix(w: torch.Tensor, wtype, k: int, *, out: torch.Tensor) -> torch.Tensor:
    """out [rows, k] (any float dtype, e.g. a bf16 scratch) = the whole dequantized matrix.

    The scratch path of the prefill GEMM (dequantize one matrix, then a cuBLAS bf16 GEMM); the
    caller owns and reuses `out`, so at most one matrix is ever held in full precision.
    """
    wtype = _check_weight(w, wtype, k, "weight")
    n = w.shape[0]
    if out.shape != (n, k) or out.stride(1) != 1:
        raise ValueError(f"out must be [{n}, {k}], got {tuple(out.shape)}")
    bt = 32
    _embed_kernel[(triton.cdiv(n, bt), triton.cdiv(k, TILE_K))](
        w, w, out, n, n, k, w.stride(0), out.stride(0), WTYPE=int(wtype), BT=bt, BK=TILE_K, ALL_ROWS=True, num_warps=4)
    return out
