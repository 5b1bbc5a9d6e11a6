"""Routed-expert decode GEMVs on the dense GEMV's dot paths (gemv/kernel.py `_dot`): byte-wise, word-wise,
or Q4_K / Q6_K rows against int8 x (dp4a), BB super-blocks per K step.

Why: the tile path (kernel.py) reads 64 columns a step through the prefill dequantizer. On the 35B-A3B (H100)
its SwiGLU launch moved 9.4 MB in 34 µs (0.28 TB/s) while the dense launches of the same K = 2048 reach
1.1–1.2 TB/s on these paths (gemv-sweep-35b-a3b-h100-20261206T0213Z.json). The arithmetic per row is the
dense GEMV's; only the rows differ: expert e = ids[j] owns rows e*N … e*N+N-1 of its stack.

  swiglu: program (j, i): act[j, rows i] = silu(G_e xn) ⊙ (U_e xn), xn = RMSNorm(x) · norm weight
  down:   program (i, j): part[j, rows i] = w_j D_e act[j]   (split; kernel.py's sum launch adds them)
          or program (i): out = residual + Σ_j w_j D_e act[j] (+ shared) in slot order (fused)
With x8, x (times the norm weight) and the k activation rows are quantized to int8 blocks first
(quant_x: one small launch each; the k rows as one vector, since blocks never cross a row).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...gguf import GGMLType
from ..gemv.kernel import QCODE, STEP_ELEMS, _dot, _rms_scale
from ..quant_x import Q8Vector, quantize_x

PATHS = ("bytes", "words", "x8", "x8q6")  # ExpertTile.path values served here ("tile" is kernel.py's)
_ALIGN = {GGMLType.Q4_K: 16, GGMLType.Q6_K: 4}  # what the words path needs of a row (gemv.kernel.words_fit)


def stack_fits_words(w: torch.Tensor, qtype: GGMLType, cols: int, bb: int) -> bool:
    """Whether the words (and int8-x) path can read this expert stack with `bb` blocks per step: whole
    word-aligned steps, whole Q6_K block pairs (gemv.kernel.words_fit, for a [E * rows, row_bytes] stack)."""
    if qtype not in _ALIGN:
        return False
    align, row_bytes = _ALIGN[qtype], w.stride(0)
    return (row_bytes % align == 0 and w.data_ptr() % align == 0 and (cols // 256) % bb == 0
            and (qtype != GGMLType.Q6_K or bb % 2 == 0))


def path_flags(path: str, qtype: GGMLType, w: torch.Tensor, cols: int, bb: int) -> dict:
    """The `_dot` flags one matrix stack gets on `path`: words where it fits, int8 x for Q4_K (x8, x8q6) and
    Q6_K (x8q6) where it fits, else the byte-wise path (masked when bb does not divide its K steps)."""
    code = QCODE[GGMLType(qtype)]
    fits = path != "bytes" and stack_fits_words(w, GGMLType(qtype), cols, bb)
    steps = cols // STEP_ELEMS[code] if w.dtype == torch.uint8 else None
    return dict(QT=code, WORDS=fits, X8=fits and path in ("x8", "x8q6") and qtype == GGMLType.Q4_K,
                X8Q6=fits and path == "x8q6" and qtype == GGMLType.Q6_K,
                KMASK=not fits and steps is not None and steps % bb != 0)


def _needs_q8(*flags: dict) -> bool:
    return any(f["X8"] or f["X8Q6"] for f in flags)


def _row_stride(w: torch.Tensor) -> int:
    return w.stride(0)  # bytes for block stacks (uint8), elements for typed rows: what `_dot` reads


@triton.jit
def _swiglu_dot_kernel(p_x, p_nw, eps, p_g, p_u, p_ids, p_act, p_xq, p_ds, p_rstd, N, K, stride_g, stride_u,
                       GT: tl.constexpr, UT: tl.constexpr, G_WORDS: tl.constexpr, U_WORDS: tl.constexpr,
                       G_X8: tl.constexpr, U_X8: tl.constexpr, G_X8Q6: tl.constexpr, U_X8Q6: tl.constexpr,
                       G_KMASK: tl.constexpr, U_KMASK: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
                       ASM: tl.constexpr):
    j, i_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(p_ids + j).to(tl.int64)
    i_r = i_n * BN + tl.arange(0, BN)
    rmask = i_r < N
    rows = e * N + tl.minimum(i_r, N - 1).to(tl.int64)  # clamp instead of masking the loads
    g, ss = _dot(p_g, stride_g, rows, p_x, p_nw, p_xq, p_ds, K, GT, BN, BB, True, G_KMASK, 1, 2, G_WORDS, G_X8,
                 G_X8Q6, ASM)
    u, _ = _dot(p_u, stride_u, rows, p_x, p_nw, p_xq, p_ds, K, UT, BN, BB, True, U_KMASK, 1, 2, U_WORDS, U_X8,
                U_X8Q6, ASM)
    # 1 / rms as the dense SwiGLU launch takes it: quantize_x wrote it when either matrix is on int8 x,
    # else the gate's fp32 path summed the squares
    r = _rms_scale(ss, K, eps, p_rstd, G_X8 or G_X8Q6 or U_X8 or U_X8Q6)
    g = g * r
    u = u * r
    tl.store(p_act + j * N + i_r, g / (1.0 + tl.exp(-g)) * u, mask=rmask)


@triton.jit
def _down_slot_dot(p_act, p_d, p_ids, p_w, p_xq, p_ds, j, i_r, N, K, stride_d, DT: tl.constexpr,
                   WORDS: tl.constexpr, X8: tl.constexpr, X8Q6: tl.constexpr, KMASK: tl.constexpr,
                   BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr):
    """w_j D_{ids[j]} act[j] over rows i_r: one slot's share, the same arithmetic in both launch shapes."""
    e = tl.load(p_ids + j).to(tl.int64)
    rows = e * N + tl.minimum(i_r, N - 1).to(tl.int64)
    # slot j's activation row, and its int8 blocks (row j of the quantized [k * K] vector; 4 floats a block)
    acc, _ = _dot(p_d, stride_d, rows, p_act + j * K, p_act, p_xq + j * K, p_ds + j * (K // 32) * 4, K, DT, BN, BB,
                  False, KMASK, 1, 2, WORDS, X8, X8Q6, ASM)
    return tl.load(p_w + j) * acc


@triton.jit
def _down_part_dot_kernel(p_act, p_d, p_ids, p_w, p_part, p_xq, p_ds, N, K, stride_d, DT: tl.constexpr,
                          WORDS: tl.constexpr, X8: tl.constexpr, X8Q6: tl.constexpr, KMASK: tl.constexpr,
                          BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr):
    i_r = tl.program_id(0) * BN + tl.arange(0, BN)
    j = tl.program_id(1)
    part = _down_slot_dot(p_act, p_d, p_ids, p_w, p_xq, p_ds, j, i_r, N, K, stride_d, DT, WORDS, X8, X8Q6, KMASK,
                          BN, BB, ASM)
    tl.store(p_part + j * N + i_r, part, mask=i_r < N)


@triton.jit
def _down_dot_kernel(p_act, p_d, p_ids, p_w, p_shared, p_slogit, p_res, p_out, p_xq, p_ds, N, K, stride_d,
                     DT: tl.constexpr, WORDS: tl.constexpr, X8: tl.constexpr, X8Q6: tl.constexpr,
                     KMASK: tl.constexpr, KSEL: tl.constexpr, HAS_SHARED: tl.constexpr, BN: tl.constexpr,
                     BB: tl.constexpr, ASM: tl.constexpr):
    i_r = tl.program_id(0) * BN + tl.arange(0, BN)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for j in tl.static_range(KSEL):  # fixed slot order: deterministic, no atomics
        acc += _down_slot_dot(p_act, p_d, p_ids, p_w, p_xq, p_ds, j, i_r, N, K, stride_d, DT, WORDS, X8, X8Q6,
                              KMASK, BN, BB, ASM)
    mask = i_r < N
    if HAS_SHARED:
        acc += tl.sigmoid(tl.load(p_slogit)) * tl.load(p_shared + i_r, mask=mask, other=0.0)
    acc += tl.load(p_res + i_r, mask=mask, other=0.0)
    tl.store(p_out + i_r, acc, mask=mask)


def swiglu(x, norm_weight, eps, gate, gate_type, up, up_type, ids, n_ff, out, *, bn, bb, path, num_warps,
           q8: Q8Vector | None):
    """kernel.experts_swiglu_gemv on a dense GEMV path (checked by the caller)."""
    d, k = x.shape[-1], ids.numel()
    fg, fu = path_flags(path, gate_type, gate, d, bb), path_flags(path, up_type, up, d, bb)
    x8 = _needs_q8(fg, fu)
    if x8:
        q8 = quantize_x(x, q8 if q8 is not None else Q8Vector.empty(d, x.device), norm_weight, eps)
    qa = (q8.q, q8.ds, q8.rstd) if x8 else (out, out, out)
    _swiglu_dot_kernel[(k, triton.cdiv(n_ff, bn))](
        x, norm_weight, float(eps), gate, up, ids, out, *qa, n_ff, d, _row_stride(gate), _row_stride(up),
        GT=fg["QT"], UT=fu["QT"], G_WORDS=fg["WORDS"], U_WORDS=fu["WORDS"], G_X8=fg["X8"], U_X8=fu["X8"],
        G_X8Q6=fg["X8Q6"], U_X8Q6=fu["X8Q6"], G_KMASK=fg["KMASK"], U_KMASK=fu["KMASK"], BN=bn, BB=bb,
        ASM=x.device.type != "cpu", num_warps=num_warps)
    return out


def down(act, down_w, down_type, ids, weights, extra, *, has_shared, bn, bb, path, num_warps, split, part,
         q8: Q8Vector | None):
    """kernel.experts_down_gemv on a dense GEMV path; `extra` = (shared, shared_logit, residual, out) as there.
    Returns True when the caller still has to add the split parts (its sum launch)."""
    k, n_ff = act.shape
    d = extra[2].shape[-1]
    f = path_flags(path, down_type, down_w, n_ff, bb)
    x8 = _needs_q8(f)
    if x8:  # the k activation rows as one vector: 32-element blocks never cross a row (n_ff % 256 == 0)
        q8 = quantize_x(act.view(-1), q8 if q8 is not None else Q8Vector.empty(k * n_ff, act.device))
    qa = (q8.q, q8.ds) if x8 else (act, act)
    flags = dict(DT=f["QT"], WORDS=f["WORDS"], X8=f["X8"], X8Q6=f["X8Q6"], KMASK=f["KMASK"], BN=bn, BB=bb,
                 ASM=act.device.type != "cpu", num_warps=num_warps)
    if split:
        _down_part_dot_kernel[(triton.cdiv(d, bn), k)](act, down_w, ids, weights, part, *qa, d, n_ff,
                                                       _row_stride(down_w), **flags)
        return True
    _down_dot_kernel[(triton.cdiv(d, bn),)](act, down_w, ids, weights, *extra, *qa, d, n_ff, _row_stride(down_w),
                                            KSEL=k, HAS_SHARED=has_shared, **flags)
    return False
