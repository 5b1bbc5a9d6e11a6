"""Embedding lookup that dequantizes only the rows asked for (token ids read on the device).

One program per (token, block of the row). Also records each consumed token id at
history[pos + i] when a history buffer is given (greedy generation reads it back once).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gemv.kernel import QCODE, STEP_ELEMS, _k4_scale_min
from ...triton.weights import QWeight


@triton.jit
def _embed_kernel(p_w, row_bytes, p_ids, p_out, d, p_pos, p_hist, QT: tl.constexpr, HIST: tl.constexpr,
                  BE: tl.constexpr):
    i_t = tl.program_id(0)
    i_b = tl.program_id(1)
    tok = tl.load(p_ids + i_t).to(tl.int64)
    if HIST:
        if i_b == 0:
            tl.store(p_hist + tl.load(p_pos) + i_t, tok.to(tl.int32))
    e = tl.arange(0, BE)  # element inside this block
    base = tok * row_bytes + i_b * (144 + 32 * (QT - 4) if QT == 4 or QT == 5 else (210 if QT == 6 else 34))
    p_h = p_w.to(tl.pointer_type(tl.float16))
    if QT == 4 or QT == 5:
        c = e // 64
        hi = (e % 64) // 32
        li = e % 32
        qs = tl.load(p_w + base + 16 + 32 * (QT - 4) + 32 * c + li).to(tl.int32)
        q = tl.where(hi == 1, qs >> 4, qs & 15)
        j = 2 * c + hi
        if QT == 5:
            qh = tl.load(p_w + base + 16 + li).to(tl.int32)
            q += ((qh >> j) & 1) << 4
        sc, mn = _k4_scale_min(p_w, base, j)  # [1, BE]
        d0 = tl.load(p_h + base // 2).to(tl.float32)
        dm = tl.load(p_h + base // 2 + 1).to(tl.float32)
        val = tl.reshape(d0 * sc * q.to(tl.float32)[None, :] - dm * mn, [BE])
    elif QT == 6:
        n = e // 128
        r = e % 128
        qq = r // 32
        li = r % 32
        ql = tl.load(p_w + base + 64 * n + li + 32 * (qq % 2)).to(tl.int32)
        qh = tl.load(p_w + base + 128 + 32 * n + li).to(tl.int32)
        q = tl.where(qq >= 2, ql >> 4, ql & 15) | (((qh >> (2 * qq)) & 3) << 4)
        sc = tl.load(p_w.to(tl.pointer_type(tl.int8)) + base + 192 + 8 * n + li // 16 + 2 * qq).to(tl.float32)
        val = tl.load(p_h + (base + 208) // 2).to(tl.float32) * sc * (q - 32).to(tl.float32)
    elif QT == 3:
        q = tl.load(p_w.to(tl.pointer_type(tl.int8)) + base + 2 + e).to(tl.float32)
        val = tl.load(p_h + base // 2).to(tl.float32) * q
    else:  # typed rows, row_bytes = row stride in elements
        offs = i_b * BE + e
        val = tl.load(p_w + tok * row_bytes + offs, mask=offs < d, other=0.0).to(tl.float32)
    offs = i_b * BE + e
    tl.store(p_out + i_t * d + offs, val, mask=offs < d)


def embed(w: QWeight, ids: torch.Tensor, out: torch.Tensor, pos: torch.Tensor | None = None,
          history: torch.Tensor | None = None) -> torch.Tensor:
    """out[i] = dequantized row ids[i] of w (fp32 [n, d]); history[pos + i] = ids[i] if given."""
    n = ids.numel()
    if ids.dtype != torch.int32 or out.shape != (n, w.cols) or out.dtype != torch.float32:
        raise ValueError(f"embed: ids must be int32 [n], out fp32 [{n}, {w.cols}]; got {ids.dtype}, {tuple(out.shape)}")
    qt = QCODE[w.qtype]
    be = STEP_ELEMS[qt] if w.is_block else min(1024, triton.next_power_of_2(w.cols))
    stride = w.row_bytes if w.is_block else w.data.stride(0)
    hist = history is not None and pos is not None
    grid = (n, triton.cdiv(w.cols, be))
    _embed_kernel[grid](w.data, stride, ids, out, w.cols, pos if hist else ids, history if hist else ids,
                        QT=qt, HIST=hist, BE=be)
    return out
