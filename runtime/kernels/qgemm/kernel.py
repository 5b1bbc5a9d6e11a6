"""Prefill GEMM straight from GGUF block bytes: y = x Wᵀ (+ residual), and the fused SwiGLU pair.

Each program dequantizes a [BN, 64] weight tile in registers (dequant.py) to bf16 and feeds
tl.dot with fp32 accumulation; no full-precision copy of a weight ever exists. Fixed configs
per shape class (no autotune), one small config under the interpreter.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ...gguf.types import GGMLType
from ..tl_utils import dot_flags, interpreting, mma_bf16
from .dequant import TILE_K, dequant_pair
from .naive import DENSE_TYPES, row_bytes

SUPPORTED = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)


def _env_config() -> dict | None:
    """TOKENGATE_QGEMM_CONFIG="BM=128,BN=128,GROUP_M=8,num_warps=8,num_stages=3" overrides the
    large-M class (tuning runs on the GPU box without code edits)."""
    spec = os.environ.get("TOKENGATE_QGEMM_CONFIG")
    if not spec:
        return None
    cfg = {k: int(v) for k, v in (item.split("=") for item in spec.split(",") if item)}
    missing = {"BM", "BN", "GROUP_M", "num_warps", "num_stages"} - set(cfg)
    if missing:
        raise ValueError(f"TOKENGATE_QGEMM_CONFIG lacks {sorted(missing)}: {spec!r}")
    return cfg


def pick_config(m: int, n: int) -> dict:
    """Tile sizes by shape class. BK is fixed at 64 (two 32-column dequant halves)."""
    if interpreting():
        return dict(BM=64, BN=256, GROUP_M=1, num_warps=1, num_stages=1)  # few, large programs: the interpreter pays per program
    if m <= 16:
        return dict(BM=16, BN=64, GROUP_M=1, num_warps=4, num_stages=4)
    if m <= 64:
        return dict(BM=64, BN=64, GROUP_M=4, num_warps=4, num_stages=4)
    if m <= 256:
        return dict(BM=128, BN=64, GROUP_M=8, num_warps=4, num_stages=4)
    return _env_config() or dict(BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=3)


@triton.jit
def _tile_ids(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped program order so consecutive programs share weight tiles in L2."""
    i_pid = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    per_group = GROUP_M * n_n
    first_m = (i_pid // per_group) * GROUP_M
    group_m = tl.minimum(n_m - first_m, GROUP_M)
    i_m = first_m + (i_pid % per_group) % group_m
    i_n = (i_pid % per_group) // group_m
    return i_m, i_n


@triton.jit
def _qgemm_kernel(
    p_x, p_w, p_y, p_res, M, N, K, stride_x, stride_w, stride_y, stride_res,
    WTYPE: tl.constexpr, HAS_RES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr, DOT_BF16: tl.constexpr,
):
    i_m, i_n = _tile_ids(M, N, BM, BN, GROUP_M)
    offs_m = i_m * BM + tl.arange(0, BM)
    offs_n = i_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK // 2)
    mask_m = offs_m < M
    mask_n = offs_n < N
    p_xrow = p_x + offs_m[:, None].to(tl.int64) * stride_x
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        # dequantize, round to bf16 at once, and load each x half right before its dot: fewer live
        # registers (no spills at 128x128 on sm_90)
        b_w0, b_w1 = dequant_pair(p_w, stride_w, offs_n, mask_n, k0, K, WTYPE)
        b_w0 = b_w0.to(tl.bfloat16)
        b_w1 = b_w1.to(tl.bfloat16)
        b_x0 = tl.load(p_xrow + (k0 + offs_k)[None, :], mask=mask_m[:, None] & ((k0 + offs_k) < K)[None, :], other=0.0)
        acc = mma_bf16(b_x0, tl.trans(b_w0), acc, DOT_BF16)
        b_x1 = tl.load(p_xrow + (k0 + 32 + offs_k)[None, :], mask=mask_m[:, None] & ((k0 + 32 + offs_k) < K)[None, :], other=0.0)
        acc = mma_bf16(b_x1, tl.trans(b_w1), acc, DOT_BF16)
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_RES:
        acc += tl.load(p_res + offs_m[:, None].to(tl.int64) * stride_res + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(p_y + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :], acc.to(p_y.dtype.element_ty), mask=mask)


@triton.jit
def _qgemm_swiglu_kernel(
    p_x, p_wg, p_wu, p_y, M, N, K, stride_x, stride_wg, stride_wu, stride_y,
    GTYPE: tl.constexpr, UTYPE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr, DOT_BF16: tl.constexpr,
):
    i_m, i_n = _tile_ids(M, N, BM, BN, GROUP_M)
    offs_m = i_m * BM + tl.arange(0, BM)
    offs_n = i_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK // 2)
    mask_m = offs_m < M
    mask_n = offs_n < N
    p_xrow = p_x + offs_m[:, None].to(tl.int64) * stride_x
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        b_g0, b_g1 = dequant_pair(p_wg, stride_wg, offs_n, mask_n, k0, K, GTYPE)
        b_g0 = b_g0.to(tl.bfloat16)
        b_g1 = b_g1.to(tl.bfloat16)
        b_x0 = tl.load(p_xrow + (k0 + offs_k)[None, :], mask=mask_m[:, None] & ((k0 + offs_k) < K)[None, :], other=0.0)
        acc_g = mma_bf16(b_x0, tl.trans(b_g0), acc_g, DOT_BF16)
        b_x1 = tl.load(p_xrow + (k0 + 32 + offs_k)[None, :], mask=mask_m[:, None] & ((k0 + 32 + offs_k) < K)[None, :], other=0.0)
        acc_g = mma_bf16(b_x1, tl.trans(b_g1), acc_g, DOT_BF16)
        b_u0, b_u1 = dequant_pair(p_wu, stride_wu, offs_n, mask_n, k0, K, UTYPE)
        acc_u = mma_bf16(b_x0, tl.trans(b_u0.to(tl.bfloat16)), acc_u, DOT_BF16)
        acc_u = mma_bf16(b_x1, tl.trans(b_u1.to(tl.bfloat16)), acc_u, DOT_BF16)
    y = acc_g * tl.sigmoid(acc_g) * acc_u
    mask = mask_m[:, None] & mask_n[None, :]
    tl.store(p_y + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :], y.to(p_y.dtype.element_ty), mask=mask)


def _check_weight(w: torch.Tensor, wtype, k: int, what: str) -> GGMLType:
    try:
        wtype = GGMLType(int(wtype))
    except ValueError:
        raise ValueError(f"{what}: unsupported ggml type {wtype}") from None
    if wtype not in SUPPORTED:
        raise ValueError(f"{what}: unsupported ggml type {wtype.name}")
    if w.dim() != 2 or not w.is_contiguous():
        raise ValueError(f"{what}: expected a contiguous 2-D weight, got shape {tuple(w.shape)}")
    if wtype in DENSE_TYPES:
        if w.dtype != DENSE_TYPES[wtype] or w.shape[1] != k:
            raise ValueError(f"{what}: {wtype.name} weight must be {DENSE_TYPES[wtype]} [N, {k}], got {w.dtype} {tuple(w.shape)}")
    else:
        if k % TILE_K:
            raise ValueError(f"{what}: K={k} must be a multiple of {TILE_K} for {wtype.name}")
        want = row_bytes(wtype, k)
        if w.dtype != torch.uint8 or w.shape[1] != want:
            raise ValueError(f"{what}: {wtype.name} rows of K={k} need uint8 [N, {want}], got {w.dtype} {tuple(w.shape)}")
    return wtype


def _check_x(x: torch.Tensor, k: int) -> None:
    if x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"x must be [M, {k}] with unit column stride, got {tuple(x.shape)} strides {x.stride()}")
    if x.dtype not in (torch.bfloat16, torch.float32, torch.float16):
        raise ValueError(f"x dtype {x.dtype} not supported")


def qgemm(
    x: torch.Tensor, w: torch.Tensor, wtype, k: int, *, out: torch.Tensor | None = None,
    out_dtype=torch.float32, residual: torch.Tensor | None = None, config: dict | None = None,
) -> torch.Tensor:
    """y [M, N] = x [M, K] · dequant(w)ᵀ (+ residual; residual may be `out` itself for an in-place add)."""
    wtype = _check_weight(w, wtype, k, "qgemm weight")
    _check_x(x, k)
    m, n = x.shape[0], w.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if out.shape != (m, n) or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n}] with unit column stride, got {tuple(out.shape)}")
    if residual is not None and (residual.shape != (m, n) or residual.stride(1) != 1):
        raise ValueError(f"residual must be [{m}, {n}], got {tuple(residual.shape)}")
    if m == 0:
        return out
    cfg = dict(config or pick_config(m, n))
    bm, bn = cfg.pop("BM"), cfg.pop("BN")
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    res = residual if residual is not None else out
    _qgemm_kernel[grid](
        x, w, out, res, m, n, k, x.stride(0), w.stride(0), out.stride(0), res.stride(0),
        WTYPE=int(wtype), HAS_RES=residual is not None, BM=bm, BN=bn, BK=TILE_K, DOT_BF16=dot_flags()["DOT_BF16"], **cfg,
    )
    return out


def qgemm_swiglu(
    x: torch.Tensor, w_gate: torch.Tensor, gate_type, w_up: torch.Tensor, up_type, k: int, *,
    out: torch.Tensor | None = None, config: dict | None = None,
) -> torch.Tensor:
    """bf16 [M, F] = SiLU(x W_gateᵀ) ⊙ (x W_upᵀ), both GEMMs in one pass over x."""
    gate_type = _check_weight(w_gate, gate_type, k, "ffn_gate weight")
    up_type = _check_weight(w_up, up_type, k, "ffn_up weight")
    _check_x(x, k)
    if w_gate.shape[0] != w_up.shape[0]:
        raise ValueError(f"gate has {w_gate.shape[0]} rows, up has {w_up.shape[0]}")
    m, n = x.shape[0], w_gate.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if out.shape != (m, n) or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n}], got {tuple(out.shape)}")
    if m == 0:
        return out
    if config is None:
        config = pick_config(m, n)
        if config["BN"] > 64:  # two fp32 accumulators: halve the tile to stay in registers
            config = dict(config, BN=64)
    cfg = dict(config)
    bm, bn = cfg.pop("BM"), cfg.pop("BN")
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _qgemm_swiglu_kernel[grid](
        x, w_gate, w_up, out, m, n, k, x.stride(0), w_gate.stride(0), w_up.stride(0), out.stride(0),
        GTYPE=int(gate_type), UTYPE=int(up_type), BM=bm, BN=bn, BK=TILE_K, DOT_BF16=dot_flags()["DOT_BF16"], **cfg,
    )
    return out
