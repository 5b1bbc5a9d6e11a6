"""Routed-expert kernels straight from GGUF block bytes (the tile dequantizer of qgemm/dequant.py).

A stack of E experts is stored as llama.cpp writes it, [E, rows, cols] = 2-D [E * rows, row_bytes]
on the device; expert e owns rows e*rows … (e+1)*rows-1. Only the chosen experts' bytes are read.

Decode (one token, inside the CUDA graph; ids/weights come from moe_route on the device):
  experts_swiglu_gemv: act[j] = silu(G_e xn) ⊙ (U_e xn), e = ids[j], xn = RMSNorm(x) computed in-kernel
  experts_down_gemv:   out = residual + Σ_j w_j D_e act[j] + sigmoid(s) · shared   (res may alias out)
  ExpertTile: rows per program of both, and whether the down launch splits over the k slots (one program
    per rows x slot writes w_j D_e act[j]; a small launch adds them in slot order: the same sum, k times
    the programs for d = 2048 rows that are 64 programs of 32 on 132 SMs otherwise)
Prefill (grouped GEMM over token-sorted experts):
  sort_by_expert: slots (token, j) grouped by expert, each group padded to the row tile BM, on the
    device with static shapes (no host sync); every row tile belongs to one expert.
  grouped_swiglu / grouped_down: one program per (row tile, column tile), tl.dot on bf16 operands.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ..qgemm.dequant import TILE_K, dequant_pair
from ..quant_x import Q8Vector
from . import gemv_path
from .gemv_path import PATHS
from ..tl_utils import dot_flags, interpreting, mma_bf16


# -- decode ------------------------------------------------------------------------------------


@triton.jit
def _swiglu_gemv_kernel(p_x, p_norm, eps, p_g, p_u, p_ids, p_act, N, K, stride_g, stride_u,
                        GTYPE: tl.constexpr, UTYPE: tl.constexpr, BN: tl.constexpr, BKN: tl.constexpr):
    j, i_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(p_ids + j).to(tl.int64)
    offs_n = i_n * BN + tl.arange(0, BN)
    mask_n = offs_n < N
    rows = e * N + offs_n
    kk = tl.arange(0, BKN)  # RMS of x, recomputed by every program (d floats: cheaper than a launch)
    ss = tl.zeros((BKN,), dtype=tl.float32)
    for k0 in range(0, K, BKN):
        v = tl.load(p_x + k0 + kk, mask=(k0 + kk) < K, other=0.0)
        ss += v * v
    inv = 1.0 / tl.sqrt(tl.sum(ss, 0) / K + eps)
    l = tl.arange(0, 32)
    acc_g = tl.zeros((BN,), dtype=tl.float32)
    acc_u = tl.zeros((BN,), dtype=tl.float32)
    for k0 in range(0, K, 64):
        x0 = tl.load(p_x + k0 + l) * tl.load(p_norm + k0 + l) * inv
        x1 = tl.load(p_x + k0 + 32 + l) * tl.load(p_norm + k0 + 32 + l) * inv
        g0, g1 = dequant_pair(p_g, stride_g, rows, mask_n, k0, K, GTYPE)
        acc_g += tl.sum(g0 * x0[None, :], 1) + tl.sum(g1 * x1[None, :], 1)
        u0, u1 = dequant_pair(p_u, stride_u, rows, mask_n, k0, K, UTYPE)
        acc_u += tl.sum(u0 * x0[None, :], 1) + tl.sum(u1 * x1[None, :], 1)
    act = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(p_act + j * N + offs_n, act, mask=mask_n)


@triton.jit
def _down_slot(p_act, p_d, p_ids, p_w, j, offs_n, mask_n, N, K, stride_d, DTYPE: tl.constexpr, BN: tl.constexpr):
    """w_j D_{ids[j]} act[j] over rows offs_n: one slot's share, the same arithmetic in both launch shapes."""
    e = tl.load(p_ids + j).to(tl.int64)
    rows = e * N + offs_n
    l = tl.arange(0, 32)
    part = tl.zeros((BN,), dtype=tl.float32)
    for k0 in range(0, K, 64):
        a0 = tl.load(p_act + j * K + k0 + l)
        a1 = tl.load(p_act + j * K + k0 + 32 + l)
        d0, d1 = dequant_pair(p_d, stride_d, rows, mask_n, k0, K, DTYPE)
        part += tl.sum(d0 * a0[None, :], 1) + tl.sum(d1 * a1[None, :], 1)
    return tl.load(p_w + j) * part


@triton.jit
def _down_finish(acc, p_shared, p_slogit, p_res, p_out, offs_n, mask_n, HAS_SHARED: tl.constexpr):
    if HAS_SHARED:
        acc += tl.sigmoid(tl.load(p_slogit)) * tl.load(p_shared + offs_n, mask=mask_n, other=0.0)
    acc += tl.load(p_res + offs_n, mask=mask_n, other=0.0)
    tl.store(p_out + offs_n, acc, mask=mask_n)


@triton.jit
def _down_gemv_kernel(p_act, p_d, p_ids, p_w, p_shared, p_slogit, p_res, p_out, N, K, stride_d,
                      DTYPE: tl.constexpr, KSEL: tl.constexpr, HAS_SHARED: tl.constexpr, BN: tl.constexpr):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    mask_n = offs_n < N
    acc = tl.zeros((BN,), dtype=tl.float32)
    for j in tl.static_range(KSEL):  # fixed slot order: deterministic, no atomics
        acc += _down_slot(p_act, p_d, p_ids, p_w, j, offs_n, mask_n, N, K, stride_d, DTYPE, BN)
    _down_finish(acc, p_shared, p_slogit, p_res, p_out, offs_n, mask_n, HAS_SHARED)


@triton.jit
def _down_part_kernel(p_act, p_d, p_ids, p_w, p_part, N, K, stride_d, DTYPE: tl.constexpr, BN: tl.constexpr):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    mask_n = offs_n < N
    j = tl.program_id(1)
    part = _down_slot(p_act, p_d, p_ids, p_w, j, offs_n, mask_n, N, K, stride_d, DTYPE, BN)
    tl.store(p_part + j * N + offs_n, part, mask=mask_n)


@triton.jit
def _down_sum_kernel(p_part, p_shared, p_slogit, p_res, p_out, N, KSEL: tl.constexpr, HAS_SHARED: tl.constexpr,
                     BN: tl.constexpr):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    mask_n = offs_n < N
    acc = tl.zeros((BN,), dtype=tl.float32)
    for j in tl.static_range(KSEL):  # the fused kernel's order: the same sum
        acc += tl.load(p_part + j * N + offs_n, mask=mask_n, other=0.0)
    _down_finish(acc, p_shared, p_slogit, p_res, p_out, offs_n, mask_n, HAS_SHARED)


@dataclass(frozen=True)
class ExpertTile:
    """Decode expert GEMV launch shape: rows per program of the SwiGLU and the down launch, warps, whether
    the down launch splits over the k chosen slots (then its partial sums are added by a second launch), and
    the dot path: "tile" (this file: the prefill dequantizer, 64 columns a step) or one of the dense GEMV's
    (gemv_path.py: "bytes", "words", "x8" = Q4_K on int8 x, "x8q6" = Q6_K too) with block_b super-blocks
    a step."""

    bn_swiglu: int = 32
    bn_down: int = 32
    split_down: bool = False
    num_warps: int = 4
    path: str = "tile"
    block_b: int = 2
    fold_shared: bool = False  # the shared expert as one more slot of both launches (dense GEMV paths only)

    def __post_init__(self):
        for bn in (self.bn_swiglu, self.bn_down, self.block_b):
            if bn < 1 or bn & (bn - 1):
                raise ValueError(f"ExpertTile: rows per program and blocks per step must be powers of two, got {bn}")
        if self.path not in ("tile",) + PATHS:
            raise ValueError(f"ExpertTile: path {self.path!r} is not one of {('tile',) + PATHS}")
        if self.fold_shared:
            _no_fold_on_tile_path(self, "ExpertTile")

    @classmethod
    def parse(cls, name: str) -> "ExpertTile":
        """'s32d32w4' (fused down), 's16d32w4split', 's16d16w4split-x8bb2', 's16d16w4split-x8-shared': the benches'
        names for a tile."""
        m = re.fullmatch(r"s(\d+)d(\d+)w(\d+)(split)?(?:-(bytes|words|x8q6|x8)(?:bb(\d+))?)?(-shared)?", name)
        if not m:
            raise ValueError(f"expert tile {name!r}: expected s<rows>d<rows>w<warps>[split][-<path>[bb<blocks>]]"
                             "[-shared], e.g. s16d32w4split or s16d16w4split-x8bb2-shared")
        return cls(int(m[1]), int(m[2]), bool(m[4]), int(m[3]), m[5] or "tile", int(m[6] or 2), bool(m[7]))


def _rows(bn: int) -> int:
    return 64 if interpreting() else bn  # the interpreter: few programs


def _check_stack(w: torch.Tensor, rows: int, what: str) -> None:
    if w.dim() != 2 or w.shape[0] % rows or w.stride(1) != 1:
        raise ValueError(f"{what}: expected a contiguous [E * {rows}, row] expert stack, got {tuple(w.shape)}")


def _no_fold_on_tile_path(tile: ExpertTile, what: str) -> None:
    if tile.path == "tile":
        raise ValueError(f"{what}: the shared expert folds into the expert launches only on the dense GEMV paths "
                         f"(ExpertTile.path bytes/words/x8/x8q6), not {tile.path!r}")


# 35B-A3B tg128 on an H100, llama.cpp in the same call on the same file: fused 32-row tile-path launches 158.6 tok/s,
# split 16-row ones 228.7 (moe-35b-a3b-variants-h100-20261205T184404Z.json), with the MoE's dense tiles 251.4; this
# (4 rows a program, 1 warp, Q4_K and Q6_K on int8 x, the shared expert folded in) 406.0 and 406.9 against
# llama.cpp's 242.7 and 234.9 (moe-35b-a3b-variants-h100-20261206T051139Z.json, ...T051759Z.json). Per launch
# (expert-sweep-35b-a3b-h100-20261206T050244Z.json): SwiGLU 34.8 -> 10.3 µs, down 19.9 -> 9.2 µs.
DEFAULT_EXPERT_TILE = ExpertTile(bn_swiglu=4, bn_down=4, split_down=True, num_warps=1, path="x8q6", fold_shared=True)


def default_expert_tile(d_ffn_exp: int, d_ffn_shexp: int) -> ExpertTile:
    """The default for a model: the shared expert folds in only where it is as wide as a routed one."""
    return DEFAULT_EXPERT_TILE if d_ffn_exp == d_ffn_shexp else replace(DEFAULT_EXPERT_TILE, fold_shared=False)


def experts_swiglu_gemv(x, norm_weight, eps, gate, gate_type, up, up_type, ids, n_ff, out,
                        tile: ExpertTile = DEFAULT_EXPERT_TILE, q8: Q8Vector | None = None, shared=None):
    """out [k, F] fp32 = silu(G_e xn) ⊙ (U_e xn) for e = ids[j]; x [d] fp32, ids [k] int32 on the device.

    q8: on the int8-x paths, the buffer x is quantized into (of d or more; a CUDA graph needs it preallocated).
    shared = (gate, gate_type, up, up_type) of the shared expert ([F, d] each): folded in as row k of out [k + 1, F]
    (dense GEMV paths only): one launch instead of two."""
    d, k = x.shape[-1], ids.numel()
    _check_stack(gate, n_ff, "gate_exps")
    _check_stack(up, n_ff, "up_exps")
    rows = k + (shared is not None)
    if shared is not None:
        _no_fold_on_tile_path(tile, "experts_swiglu_gemv")
        _check_stack(shared[0], n_ff, "gate_shexp")
        _check_stack(shared[2], n_ff, "up_shexp")
        if shared[0].shape[0] != n_ff or shared[2].shape[0] != n_ff:
            raise ValueError(f"experts_swiglu_gemv: the shared expert must be [{n_ff}, {d}] to fold in")
    if d % TILE_K or out.shape != (rows, n_ff) or not out.is_contiguous():
        raise ValueError(f"experts_swiglu_gemv: d {d} must be a multiple of {TILE_K}, out [{rows}, {n_ff}] contiguous")
    bn = _rows(tile.bn_swiglu)
    if tile.path != "tile":
        return gemv_path.swiglu(x, norm_weight, eps, gate, gate_type, up, up_type, ids, n_ff, out, bn=bn,
                                bb=tile.block_b, path=tile.path, num_warps=tile.num_warps, q8=q8, shared=shared)
    _swiglu_gemv_kernel[(k, triton.cdiv(n_ff, bn))](
        x, norm_weight, float(eps), gate, up, ids, out, n_ff, d, gate.stride(0), up.stride(0),
        GTYPE=int(gate_type), UTYPE=int(up_type), BN=bn, BKN=triton.next_power_of_2(min(d, 1024)),
        num_warps=tile.num_warps)
    return out


def experts_down_gemv(act, down, down_type, ids, weights, residual, out, shared=None, shared_logit=None,
                      tile: ExpertTile = DEFAULT_EXPERT_TILE, part: torch.Tensor | None = None,
                      q8: Q8Vector | None = None, shared_down=None):
    """out [d] = residual + Σ_j weights[j] D_{ids[j]} act[j] (+ sigmoid(shared_logit) · shared); out may be residual.

    tile.split_down needs `part`, an fp32 [slots, d] scratch (a CUDA graph keeps its address); q8: on the int8-x
    paths, the buffer the activation rows are quantized into (slots * F or more). shared_down = (matrix [d, F],
    type) folds the shared expert in (dense GEMV paths only): act row k is its activation, its share is
    sigmoid(shared_logit) D_shared act[k], and `shared` (its output from launches before) is not given."""
    slots, n_ff = act.shape
    k = ids.numel()
    d = residual.shape[-1]
    _check_stack(down, d, "down_exps")
    if shared_down is not None:
        _no_fold_on_tile_path(tile, "experts_down_gemv")
        if shared is not None or shared_logit is None or shared_down[0].shape[0] != d:
            raise ValueError("experts_down_gemv: a folded shared expert needs its logit and [d, F] matrix, not its "
                             "output")
    if slots != k + (shared_down is not None):
        raise ValueError(f"experts_down_gemv: act has {slots} rows for {k} experts"
                         + (" and the shared one" if shared_down is not None else ""))
    if n_ff % TILE_K or not act.is_contiguous():
        raise ValueError(f"experts_down_gemv: expert width {n_ff} must be a multiple of {TILE_K}, act contiguous")
    has_shared = shared is not None
    extra = (shared if has_shared else residual, shared_logit if shared_logit is not None else weights, residual, out)
    bn = _rows(tile.bn_down)
    if tile.split_down and (part is None or part.shape != (slots, d) or part.dtype != torch.float32
                            or not part.is_contiguous()):
        raise ValueError(f"experts_down_gemv: a split down launch needs part, fp32 [{slots}, {d}] contiguous")
    if tile.path != "tile":  # the split's part launch or the fused launch, on a dense GEMV path
        gemv_path.down(act, down, down_type, ids, weights, extra, has_shared=has_shared, bn=bn, bb=tile.block_b,
                       path=tile.path, num_warps=tile.num_warps, split=tile.split_down, part=part, q8=q8,
                       shared_down=shared_down)
    elif tile.split_down:
        _down_part_kernel[(triton.cdiv(d, bn), k)](act, down, ids, weights, part, d, n_ff, down.stride(0),
                                                   DTYPE=int(down_type), BN=bn, num_warps=tile.num_warps)
    else:
        _down_gemv_kernel[(triton.cdiv(d, bn),)](
            act, down, ids, weights, *extra, d, n_ff, down.stride(0), DTYPE=int(down_type), KSEL=k,
            HAS_SHARED=has_shared, BN=bn, num_warps=tile.num_warps)
    if tile.split_down:  # the slots' parts added in the fused kernel's order
        _down_sum_kernel[(triton.cdiv(d, 256),)](part, *extra, d, KSEL=slots, HAS_SHARED=has_shared, BN=256,
                                                 num_warps=4)
    return out


# -- prefill -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpertSort:
    """Slots (token t, choice j) -> s = t*k + j, grouped by expert and padded per expert to `bm` rows."""

    slot_of_row: torch.Tensor  # [P] int32, -1 on padding rows
    tile_expert: torch.Tensor  # [P / bm] int32, E for tiles past the last group
    bm: int

    @property
    def n_rows(self) -> int:
        return self.slot_of_row.shape[0]


def sort_by_expert(ids: torch.Tensor, n_expert: int, bm: int) -> ExpertSort:
    """Device-only, no host sync: P = bm * ceil((T*k + E*(bm-1)) / bm) rows is a static upper bound. (torch.bincount
    is not used: on CUDA it reads the ids' min and max back to the host, two syncs per MoE layer of a prefill.)"""
    flat = ids.reshape(-1).long()
    n = flat.numel()
    e_sorted, order = torch.sort(flat, stable=True)
    counts = torch.zeros(n_expert, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + bm - 1) // bm * bm
    pend = torch.cumsum(padded, 0)
    pstart, start = pend - padded, torch.cumsum(counts, 0) - counts
    pos = pstart.gather(0, e_sorted) + torch.arange(n, device=ids.device) - start.gather(0, e_sorted)
    n_rows = -(-(n + n_expert * (bm - 1)) // bm) * bm
    slot_of_row = torch.full((n_rows,), -1, dtype=torch.int32, device=ids.device).scatter_(0, pos, order.to(torch.int32))
    tiles = torch.arange(n_rows // bm, device=ids.device) * bm
    tile_expert = torch.searchsorted(pend, tiles, right=True).to(torch.int32)
    return ExpertSort(slot_of_row, tile_expert, bm)


@triton.jit
def _grouped_swiglu_kernel(p_x, p_slot, p_tile_e, p_g, p_u, p_act, E, N, K, stride_x, stride_g, stride_u,
                           KSEL: tl.constexpr, GTYPE: tl.constexpr, UTYPE: tl.constexpr, BM: tl.constexpr,
                           BN: tl.constexpr, DOT_BF16: tl.constexpr):
    i_t, i_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(p_tile_e + i_t)
    if e >= E:  # a tile past the last group (the grid is a static bound): no work, not even masked dequantization
        return
    e64 = e.to(tl.int64)
    r = i_t * BM + tl.arange(0, BM)
    slot = tl.load(p_slot + r)
    mask_m = slot >= 0
    tok = tl.where(mask_m, slot // KSEL, 0).to(tl.int64)
    offs_n = i_n * BN + tl.arange(0, BN)
    mask_n = offs_n < N
    rows = e64 * N + offs_n
    l = tl.arange(0, 32)
    p_xrow = p_x + tok[:, None] * stride_x
    mx = mask_m[:, None] & (l < 32)[None, :]  # full-shape mask (the interpreter does not broadcast masks)
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, 64):
        x0 = tl.load(p_xrow + (k0 + l)[None, :], mask=mx, other=0.0)
        x1 = tl.load(p_xrow + (k0 + 32 + l)[None, :], mask=mx, other=0.0)
        g0, g1 = dequant_pair(p_g, stride_g, rows, mask_n, k0, K, GTYPE)
        acc_g = mma_bf16(x0, tl.trans(g0), acc_g, DOT_BF16)
        acc_g = mma_bf16(x1, tl.trans(g1), acc_g, DOT_BF16)
        u0, u1 = dequant_pair(p_u, stride_u, rows, mask_n, k0, K, UTYPE)
        acc_u = mma_bf16(x0, tl.trans(u0), acc_u, DOT_BF16)
        acc_u = mma_bf16(x1, tl.trans(u1), acc_u, DOT_BF16)
    y = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(p_act + r[:, None].to(tl.int64) * N + offs_n[None, :], y.to(p_act.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _grouped_down_kernel(p_act, p_slot, p_tile_e, p_w, p_d, p_y, E, N, K, stride_d,
                         DTYPE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DOT_BF16: tl.constexpr):
    i_t, i_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(p_tile_e + i_t)
    if e >= E:  # a tile past the last group (the grid is a static bound): no work, not even masked dequantization
        return
    e64 = e.to(tl.int64)
    r = i_t * BM + tl.arange(0, BM)
    slot = tl.load(p_slot + r)
    mask_m = slot >= 0
    offs_n = i_n * BN + tl.arange(0, BN)
    mask_n = offs_n < N
    rows = e64 * N + offs_n
    l = tl.arange(0, 32)
    p_arow = p_act + r[:, None].to(tl.int64) * K
    ma = mask_m[:, None] & (l < 32)[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, 64):
        a0 = tl.load(p_arow + (k0 + l)[None, :], mask=ma, other=0.0)
        a1 = tl.load(p_arow + (k0 + 32 + l)[None, :], mask=ma, other=0.0)
        d0, d1 = dequant_pair(p_d, stride_d, rows, mask_n, k0, K, DTYPE)
        acc = mma_bf16(a0, tl.trans(d0), acc, DOT_BF16)
        acc = mma_bf16(a1, tl.trans(d1), acc, DOT_BF16)
    w = tl.load(p_w + tl.where(mask_m, slot, 0), mask=mask_m, other=0.0)
    s64 = tl.where(mask_m, slot, 0).to(tl.int64)
    tl.store(p_y + s64[:, None] * N + offs_n[None, :], acc * w[:, None], mask=mask_m[:, None] & mask_n[None, :])


@dataclass(frozen=True)
class GroupedTile:
    """Prefill grouped-GEMM tile: BM slot rows (each expert's group is padded to a multiple), BN columns, warps."""

    bm: int = 64
    bn: int = 64
    num_warps: int = 4

    def __post_init__(self):
        for v in (self.bm, self.bn):
            if v < 16 or v & (v - 1):
                raise ValueError(f"GroupedTile: bm and bn must be powers of two >= 16 (tl.dot), got {v}")

    @classmethod
    def parse(cls, name: str) -> "GroupedTile":
        """'bm16bn64w4': the benches' names for a tile."""
        m = re.fullmatch(r"bm(\d+)bn(\d+)w(\d+)", name)
        if not m:
            raise ValueError(f"grouped tile {name!r}: expected bm<rows>bn<cols>w<warps>, e.g. bm16bn64w4")
        return cls(int(m[1]), int(m[2]), int(m[3]))


def _gemm_tiles(n_tokens: int) -> GroupedTile:
    """Rows per expert are ~T*k/E, so a small BM wastes less padding."""
    if interpreting():  # few, wide programs: the interpreter pays per program (CI time)
        return GroupedTile(16, 256, 1)
    return GroupedTile(16, 64, 4) if n_tokens <= 256 else GroupedTile(64, 64, 4)


def grouped_experts(x, ids, weights, gate, gate_type, up, up_type, down, down_type, n_expert: int, n_ff: int,
                    sort: ExpertSort | None = None, tile: GroupedTile | None = None) -> torch.Tensor:
    """[T, d] normed input (bf16 or fp32) -> fp32 [T, d] = Σ_j weights[t, j] expert_{ids[t, j]}(x[t]).

    tile: None = by the token count (_gemm_tiles); a `sort` given must be padded to its bm."""
    t, d = x.shape
    k = ids.shape[1]
    for w, rows, what in ((gate, n_ff, "gate_exps"), (up, n_ff, "up_exps"), (down, d, "down_exps")):
        _check_stack(w, rows, what)
    if d % TILE_K or n_ff % TILE_K or x.stride(1) != 1:
        raise ValueError(f"grouped_experts: d {d} and width {n_ff} must be multiples of {TILE_K}")
    if tile is None:
        tile = _gemm_tiles(t) if sort is None else replace(_gemm_tiles(t), bm=sort.bm)
    if sort is None:
        sort = sort_by_expert(ids, n_expert, tile.bm)
    elif sort.bm != tile.bm:
        raise ValueError(f"grouped_experts: the sort is padded to {sort.bm} rows, the tile has bm {tile.bm}")
    bn, nw = tile.bn, tile.num_warps
    n_tiles = sort.n_rows // sort.bm
    act = torch.empty(sort.n_rows, n_ff, dtype=torch.bfloat16, device=x.device)
    flags = dot_flags()["DOT_BF16"]
    _grouped_swiglu_kernel[(n_tiles, triton.cdiv(n_ff, bn))](
        x, sort.slot_of_row, sort.tile_expert, gate, up, act, n_expert, n_ff, d, x.stride(0), gate.stride(0),
        up.stride(0), KSEL=k, GTYPE=int(gate_type), UTYPE=int(up_type), BM=sort.bm, BN=bn, DOT_BF16=flags,
        num_warps=nw)
    y = torch.empty(t * k, d, dtype=torch.float32, device=x.device)  # per slot: summed in slot order below
    w = weights.reshape(-1).contiguous()
    _grouped_down_kernel[(n_tiles, triton.cdiv(d, bn))](
        act, sort.slot_of_row, sort.tile_expert, w, down, y, n_expert, d, n_ff, down.stride(0),
        DTYPE=int(down_type), BM=sort.bm, BN=bn, DOT_BF16=flags, num_warps=nw)
    return y.view(t, k, d).sum(1)
