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
from ...triton.weights import QWeight
from ..gemv.kernel import QCODE, WORDS_TYPES, GemvConfig, _dot, _k_steps, _rms_scale, words_fit, x8_paths
from ..quant_x import Q8Vector, quantize_x

PATHS = ("bytes", "words", "x8", "x8q6")  # ExpertTile.path values served here ("tile" is kernel.py's)


def path_flags(path: str, qtype: GGMLType, w: torch.Tensor, cols: int, bb: int) -> dict:
    """The `_dot` flags one expert stack [E * rows, row] gets on `path`, by the dense launch's own rules
    (gemv.kernel._launch): words where words_fit, int8 x for Q4_K (x8, x8q6) and Q6_K (x8q6) where it fits,
    else the byte-wise path (masked when bb does not divide its K steps)."""
    stack = QWeight("expert stack", GGMLType(qtype), w.shape[0], cols, w)
    cfg = GemvConfig(block_b=bb, words=path != "bytes", x8=path in ("x8", "x8q6"), x8_q6=path == "x8q6")
    x8, x8q6 = x8_paths(cfg, [stack])
    steps = _k_steps(stack)
    return dict(QT=QCODE[stack.qtype], WORDS=cfg.words and stack.qtype in WORDS_TYPES and words_fit(stack, bb),
                X8=x8, X8Q6=x8q6, KMASK=steps is not None and steps % bb != 0)


def _needs_q8(*flags: dict) -> bool:
    return any(f["X8"] or f["X8Q6"] for f in flags)


def _row_stride(w: torch.Tensor) -> int:
    return w.stride(0)  # bytes for block stacks (uint8), elements for typed rows: what `_dot` reads


@triton.jit
def _gate_up(p_g, p_u, stride_g, stride_u, rows, p_x, p_nw, p_xq, p_ds, K, GT: tl.constexpr, UT: tl.constexpr,
             G_WORDS: tl.constexpr, U_WORDS: tl.constexpr, G_X8: tl.constexpr, U_X8: tl.constexpr,
             G_X8Q6: tl.constexpr, U_X8Q6: tl.constexpr, G_KMASK: tl.constexpr, U_KMASK: tl.constexpr,
             BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr):
    """(G x_eff, U x_eff, sum of squares of x from the gate's fp32 path) over `rows` of one gate/up pair."""
    g, ss = _dot(p_g, stride_g, rows, p_x, p_nw, p_xq, p_ds, K, GT, BN, BB, True, G_KMASK, 1, 2, G_WORDS, G_X8,
                 G_X8Q6, ASM)
    u, _ = _dot(p_u, stride_u, rows, p_x, p_nw, p_xq, p_ds, K, UT, BN, BB, True, U_KMASK, 1, 2, U_WORDS, U_X8,
                U_X8Q6, ASM)
    return g, u, ss


@triton.jit
def _swiglu_dot_kernel(p_x, p_nw, eps, p_g, p_u, p_ids, p_act, p_xq, p_ds, p_rstd, N, K, stride_g, stride_u,
                       p_sg, p_su, stride_sg, stride_su,
                       GT: tl.constexpr, UT: tl.constexpr, G_WORDS: tl.constexpr, U_WORDS: tl.constexpr,
                       G_X8: tl.constexpr, U_X8: tl.constexpr, G_X8Q6: tl.constexpr, U_X8Q6: tl.constexpr,
                       G_KMASK: tl.constexpr, U_KMASK: tl.constexpr,
                       SGT: tl.constexpr, SUT: tl.constexpr, SG_WORDS: tl.constexpr, SU_WORDS: tl.constexpr,
                       SG_X8: tl.constexpr, SU_X8: tl.constexpr, SG_X8Q6: tl.constexpr, SU_X8Q6: tl.constexpr,
                       SG_KMASK: tl.constexpr, SU_KMASK: tl.constexpr,
                       KSEL: tl.constexpr, QX: tl.constexpr, BN: tl.constexpr,
                       BB: tl.constexpr, ASM: tl.constexpr):
    j, i_n = tl.program_id(0), tl.program_id(1)
    i_r = i_n * BN + tl.arange(0, BN)
    rmask = i_r < N
    local = tl.minimum(i_r, N - 1).to(tl.int64)  # clamp instead of masking the loads
    # slot KSEL: the shared expert (its own one-expert stack, same width); no program has j == KSEL without SHARED
    if j == KSEL:
        g, u, ss = _gate_up(p_sg, p_su, stride_sg, stride_su, local, p_x, p_nw, p_xq, p_ds, K, SGT, SUT, SG_WORDS,
                            SU_WORDS, SG_X8, SU_X8, SG_X8Q6, SU_X8Q6, SG_KMASK, SU_KMASK, BN, BB, ASM)
    else:
        e = tl.load(p_ids + tl.minimum(j, KSEL - 1)).to(tl.int64)
        g, u, ss = _gate_up(p_g, p_u, stride_g, stride_u, e * N + local, p_x, p_nw, p_xq, p_ds, K, GT, UT, G_WORDS,
                            U_WORDS, G_X8, U_X8, G_X8Q6, U_X8Q6, G_KMASK, U_KMASK, BN, BB, ASM)
    # 1 / rms as the dense SwiGLU launch takes it: quantize_x wrote it when any matrix of the launch is on int8 x,
    # else the gate's fp32 path summed the squares
    r = _rms_scale(ss, K, eps, p_rstd, QX)
    g = g * r
    u = u * r
    tl.store(p_act + j * N + i_r, g / (1.0 + tl.exp(-g)) * u, mask=rmask)


@triton.jit
def _down_rows(p_act, p_d, stride_d, rows, p_xq, p_ds, j, K, DT: tl.constexpr, WORDS: tl.constexpr,
               X8: tl.constexpr, X8Q6: tl.constexpr, KMASK: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
               ASM: tl.constexpr):
    """D[rows] act[j]: slot j's activation row, and its int8 blocks (row j of the quantized [slots * K] vector;
    4 floats a block)."""
    acc, _ = _dot(p_d, stride_d, rows, p_act + j * K, p_act, p_xq + j * K, p_ds + j * (K // 32) * 4, K, DT, BN, BB,
                  False, KMASK, 1, 2, WORDS, X8, X8Q6, ASM)
    return acc


@triton.jit
def _down_slot_dot(p_act, p_d, p_ids, p_w, p_sd, p_slogit, p_xq, p_ds, j, i_r, N, K, stride_d, stride_sd,
                   DT: tl.constexpr, WORDS: tl.constexpr, X8: tl.constexpr, X8Q6: tl.constexpr, KMASK: tl.constexpr,
                   SDT: tl.constexpr, SD_WORDS: tl.constexpr, SD_X8: tl.constexpr, SD_X8Q6: tl.constexpr,
                   SD_KMASK: tl.constexpr, KSEL: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
                   ASM: tl.constexpr):
    """Slot j's share over rows i_r, the same arithmetic in both launch shapes: w_j D_{ids[j]} act[j] for a routed
    slot, sigmoid(shared logit) D_shared act[KSEL] for the shared expert's."""
    local = tl.minimum(i_r, N - 1).to(tl.int64)
    if j == KSEL:  # no slot has j == KSEL without SHARED (the launches' grid and loop stop at KSEL)
        acc = _down_rows(p_act, p_sd, stride_sd, local, p_xq, p_ds, j, K, SDT, SD_WORDS, SD_X8, SD_X8Q6, SD_KMASK,
                         BN, BB, ASM)
        w = tl.sigmoid(tl.load(p_slogit))
    else:
        jj = tl.minimum(j, KSEL - 1)
        e = tl.load(p_ids + jj).to(tl.int64)
        acc = _down_rows(p_act, p_d, stride_d, e * N + local, p_xq, p_ds, j, K, DT, WORDS, X8, X8Q6, KMASK, BN, BB,
                         ASM)
        w = tl.load(p_w + jj)
    return w * acc


@triton.jit
def _down_part_dot_kernel(p_act, p_d, p_ids, p_w, p_sd, p_slogit, p_part, p_xq, p_ds, N, K, stride_d, stride_sd,
                          DT: tl.constexpr, WORDS: tl.constexpr, X8: tl.constexpr, X8Q6: tl.constexpr,
                          KMASK: tl.constexpr, SDT: tl.constexpr, SD_WORDS: tl.constexpr, SD_X8: tl.constexpr,
                          SD_X8Q6: tl.constexpr, SD_KMASK: tl.constexpr, KSEL: tl.constexpr, BN: tl.constexpr,
                          BB: tl.constexpr, ASM: tl.constexpr):
    i_r = tl.program_id(0) * BN + tl.arange(0, BN)
    j = tl.program_id(1)
    part = _down_slot_dot(p_act, p_d, p_ids, p_w, p_sd, p_slogit, p_xq, p_ds, j, i_r, N, K, stride_d, stride_sd,
                          DT, WORDS, X8, X8Q6, KMASK, SDT, SD_WORDS, SD_X8, SD_X8Q6, SD_KMASK, KSEL, BN, BB, ASM)
    tl.store(p_part + j * N + i_r, part, mask=i_r < N)


@triton.jit
def _down_dot_kernel(p_act, p_d, p_ids, p_w, p_sd, p_slogit, p_shared, p_res, p_out, p_xq, p_ds, N, K, stride_d,
                     stride_sd, DT: tl.constexpr, WORDS: tl.constexpr, X8: tl.constexpr, X8Q6: tl.constexpr,
                     KMASK: tl.constexpr, SDT: tl.constexpr, SD_WORDS: tl.constexpr, SD_X8: tl.constexpr,
                     SD_X8Q6: tl.constexpr, SD_KMASK: tl.constexpr, KSEL: tl.constexpr, SHARED: tl.constexpr,
                     HAS_SHARED_VEC: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, ASM: tl.constexpr):
    i_r = tl.program_id(0) * BN + tl.arange(0, BN)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for j in tl.static_range(KSEL + SHARED):  # fixed slot order (the shared expert's last): deterministic
        acc += _down_slot_dot(p_act, p_d, p_ids, p_w, p_sd, p_slogit, p_xq, p_ds, j, i_r, N, K, stride_d, stride_sd,
                              DT, WORDS, X8, X8Q6, KMASK, SDT, SD_WORDS, SD_X8, SD_X8Q6, SD_KMASK, KSEL, BN, BB,
                              ASM)
    mask = i_r < N
    if HAS_SHARED_VEC:  # the shared expert's output computed by launches before (not folded in)
        acc += tl.sigmoid(tl.load(p_slogit)) * tl.load(p_shared + i_r, mask=mask, other=0.0)
    acc += tl.load(p_res + i_r, mask=mask, other=0.0)
    tl.store(p_out + i_r, acc, mask=mask)


def _named(name: str, f: dict) -> dict:
    """path_flags of one matrix as a kernel's keywords: QT -> <name>T, the rest <name>_<flag> (GT, G_WORDS, ...)."""
    return {(f"{name}T" if k == "QT" else f"{name}_{k}"): v for k, v in f.items()}


def swiglu(x, norm_weight, eps, gate, gate_type, up, up_type, ids, n_ff, out, *, bn, bb, path, num_warps,
           q8: Q8Vector | None, shared=None):
    """kernel.experts_swiglu_gemv on a dense GEMV path (checked by the caller); shared = (gate, type, up, type)
    of the shared expert folds it in as slot k (out has k + 1 rows then)."""
    d, k = x.shape[-1], ids.numel()
    fg, fu = path_flags(path, gate_type, gate, d, bb), path_flags(path, up_type, up, d, bb)
    sg, sgt, su, sut = shared if shared is not None else (gate, gate_type, up, up_type)  # unused without it
    fsg, fsu = path_flags(path, sgt, sg, d, bb), path_flags(path, sut, su, d, bb)
    x8 = _needs_q8(fg, fu, *((fsg, fsu) if shared is not None else ()))
    if x8:
        q8 = quantize_x(x, q8 if q8 is not None else Q8Vector.empty(d, x.device), norm_weight, eps)
    qa = (q8.q, q8.ds, q8.rstd) if x8 else (out, out, out)
    flags = {**_named("G", fg), **_named("U", fu), **_named("SG", fsg), **_named("SU", fsu)}
    _swiglu_dot_kernel[(k + (shared is not None), triton.cdiv(n_ff, bn))](
        x, norm_weight, float(eps), gate, up, ids, out, *qa, n_ff, d, _row_stride(gate), _row_stride(up),
        sg, su, _row_stride(sg), _row_stride(su), **flags, KSEL=k, QX=x8, BN=bn, BB=bb,
        ASM=x.device.type != "cpu", num_warps=num_warps)
    return out


def down(act, down_w, down_type, ids, weights, extra, *, has_shared, bn, bb, path, num_warps, split, part,
         q8: Q8Vector | None, shared_down=None):
    """kernel.experts_down_gemv on a dense GEMV path; `extra` = (shared, shared_logit, residual, out) as there.
    shared_down = (matrix, type) folds the shared expert in as slot k (act and part have k + 1 rows; its weight
    is sigmoid(shared_logit)). With `split`, only the parts: the caller adds them (kernel.py's sum launch)."""
    slots, n_ff = act.shape
    k = slots - (shared_down is not None)
    d = extra[2].shape[-1]
    f = path_flags(path, down_type, down_w, n_ff, bb)
    sd, sdt = shared_down if shared_down is not None else (down_w, down_type)
    fs = path_flags(path, sdt, sd, n_ff, bb)
    x8 = _needs_q8(f, *((fs,) if shared_down is not None else ()))
    if x8:  # the activation rows as one vector: 32-element blocks never cross a row (n_ff % 256 == 0)
        q8 = quantize_x(act.view(-1), q8 if q8 is not None else Q8Vector.empty(slots * n_ff, act.device))
    qa = (q8.q, q8.ds) if x8 else (act, act)
    flags = dict(DT=f["QT"], WORDS=f["WORDS"], X8=f["X8"], X8Q6=f["X8Q6"], KMASK=f["KMASK"], **_named("SD", fs),
                 KSEL=k, BN=bn, BB=bb, ASM=act.device.type != "cpu", num_warps=num_warps)
    if split:
        _down_part_dot_kernel[(triton.cdiv(d, bn), slots)](act, down_w, ids, weights, sd, extra[1], part, *qa, d,
                                                           n_ff, _row_stride(down_w), _row_stride(sd), **flags)
        return
    _down_dot_kernel[(triton.cdiv(d, bn),)](act, down_w, ids, weights, sd, extra[1], extra[0], extra[2], extra[3],
                                            *qa, d, n_ff, _row_stride(down_w), _row_stride(sd),
                                            SHARED=int(shared_down is not None),
                                            HAS_SHARED_VEC=has_shared and shared_down is None, **flags)
