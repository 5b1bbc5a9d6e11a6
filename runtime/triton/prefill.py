"""Chunked prefill for the Triton engine: any prompt length, memory bounded by the chunk.

`prefill_forward(engine, token_ids, all_logits)` consumes tokens at positions
engine.position … in chunks of at most `chunk` tokens. Each chunk runs every layer with the
prefill kernels (quantized GEMMs, token-parallel conv + chunked delta rule, flash attention),
reading and updating the engine's persistent state, so a later call (or decode) continues
exactly where this one stopped (session reuse).

Engine fields read (TritonEngine, runtime/triton/engine.py, documents the same list):
  config                     runtime.config.ModelConfig
  device, max_context        torch.device, int
  weights.mat[name]          matrices: .qtype (GGMLType), .rows, .cols (K), .data (uint8 [rows, row_bytes]
                             GGUF blocks, or typed [rows, cols] for F32/F16/BF16)
  weights.vec[name]          fp32 1-D tensors (norms, ssm_a, ssm_dt.bias) and ssm_conv1d [Cc, Kc]
  weights.lm_head            the LM-head matrix (output.weight, or token_embd.weight when tied)
  state.conv[i]              fp32 [Kc-1, Cc] per GDN layer i (order of config.deltanet_layers)   (updated)
  state.ssm[i]               fp32 [Hv, dk, dv] per GDN layer                                        (updated)
  state.k_cache[i], .v_cache[i]  bf16 [max_context, Hkv, Dh] per attention layer                  (updated)
  position                   tokens consumed before this call (read only: the engine advances it)
Attributes this module keeps on the engine: prefill_workspace (chunk scratch, reused across calls),
prefill_matrix_scratch (bf16 matrix buffer of the scratch GEMM path), and it reads the optional
prefill_gemm (GEMM mode, else $TOKENGATE_PREFILL_GEMM) and prefill_chunk (a fixed chunk size, for
tests and tuning; else planned from free memory).
"""
from __future__ import annotations

import os

import torch

from ..kernels.attn_prep import attn_prep, rope_tables
from ..kernels.flash_attn import flash_attn
from ..kernels.gated_norm import gated_norm
from ..kernels.gdn_chunk import GDNScratch, gdn_chunk
from ..kernels.gdn_conv import gdn_conv
from ..kernels.qgemm import dequantize_matrix, gather_rows, qgemm, qgemm_swiglu
from ..kernels.rmsnorm import rmsnorm
from . import prefill_graph

MIN_CHUNK = 64
MAX_CHUNK = int(os.environ.get("TOKENGATE_PREFILL_MAX_CHUNK", "8192"))
FREE_FRACTION = 0.5  # of the free device memory the chunk scratch may take
# "tile": dequantize-in-tile GEMM. "scratch": dequantize one matrix at a time into a reused bf16
# buffer, then a cuBLAS GEMM (bounded by the largest layer matrix; its dequant cost is paid once per
# chunk, so it wins for long chunks). "auto" (default): scratch for chunks of at least SCRATCH_MIN_M
# tokens, tile below — measured on H200 at 0.8B: pp4096 96.0k tok/s auto vs 74.5k tile, pp32768
# 92.4k vs 64.6k (bench/runtime/prefill.py --gemm); at 512 tokens scratch vs tile: 9B 10122 vs 8002 tok/s,
# 4B 12097 vs 11381, 0.8B 16211 vs 16771 (host-bound there: its pp1024 is as fast)
# (bench/receipts/prefill-0.8b_4b_9b-20261203T115558Z.json).
GEMM_MODES = ("tile", "scratch", "auto")
SCRATCH_MIN_M = int(os.environ.get("TOKENGATE_PREFILL_SCRATCH_MIN_M", "512"))


class PrefillWorkspace:
    """Every activation buffer one chunk needs, sized by the chunk (never by the context)."""

    def __init__(self, cfg, n: int, device):
        f32, bf16 = dict(dtype=torch.float32, device=device), dict(dtype=torch.bfloat16, device=device)
        self.capacity = n
        d = cfg.d_model
        self.h = torch.empty(n, d, **f32)  # residual stream
        self.xn = torch.empty(n, d, **bf16)  # normed GEMM input
        self.act = torch.empty(n, cfg.d_ffn, **bf16)  # SiLU(gate) * up
        n_gdn, n_attn = len(cfg.deltanet_layers), len(cfg.attention_layers)
        if n_gdn:
            self.u_raw = torch.empty(n, cfg.conv_channels, **f32)
            self.u_conv = torch.empty(n, cfg.conv_channels, **f32)
            self.z = torch.empty(n, cfg.value_dim, **bf16)
            self.ab = torch.empty(n, 2 * cfg.n_v_head, **f32)  # alpha | b
            self.o = torch.empty(n, cfg.n_v_head, cfg.ssm_head_dim, **f32)
            self.y = torch.empty(n, cfg.value_dim, **bf16)
            self.gdn = GDNScratch(n, cfg.n_v_head, cfg.ssm_head_dim, device)
        if n_attn:
            self.qg = torch.empty(n, cfg.q_proj_dim, **f32)
            self.k = torch.empty(n, cfg.kv_proj_dim, **f32)
            self.v = torch.empty(n, cfg.kv_proj_dim, **f32)
            self.q = torch.empty(n, cfg.n_head, cfg.head_dim, **bf16)
            self.attn = torch.empty(n, cfg.n_head * cfg.head_dim, **bf16)

    @staticmethod
    def bytes_per_token(cfg) -> int:
        b = 4 * cfg.d_model + 2 * cfg.d_model + 2 * cfg.d_ffn
        if cfg.deltanet_layers:
            b += 8 * cfg.conv_channels + 2 * cfg.value_dim + 8 * cfg.n_v_head + 4 * cfg.value_dim + 2 * cfg.value_dim
            b += -(-GDNScratch.nbytes(4096, cfg.n_v_head, cfg.ssm_head_dim) // 4096)
        if cfg.attention_layers:
            b += 4 * cfg.q_proj_dim + 8 * cfg.kv_proj_dim + 4 * cfg.n_head * cfg.head_dim
        # the scratch GEMM path's bf16 temporaries (x@Wᵀ result; gate and up of the FFN), per token
        b += 2 * max(cfg.d_ffn, cfg.conv_channels if cfg.deltanet_layers else 0,
                     cfg.q_proj_dim if cfg.attention_layers else 0) + 4 * cfg.d_ffn
        if cfg.is_moe:  # grouped-GEMM temporaries per token: k slots of bf16 act and fp32 outputs, logits
            b += cfg.n_expert_used * (2 * cfg.d_ffn_exp + 4 * cfg.d_model) + 8 * cfg.n_expert + 8 * cfg.d_model
        return b


def plan_chunk(engine, n_tokens: int) -> int:
    """Largest chunk (multiple of 64, ≤ MAX_CHUNK) whose scratch fits FREE_FRACTION of free memory."""
    cfg = engine.config
    chunk = MAX_CHUNK
    ws = getattr(engine, "prefill_workspace", None)
    dev = torch.device(engine.device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        if ws is not None:  # the existing workspace counts as available
            free += ws.capacity * PrefillWorkspace.bytes_per_token(cfg)
        chunk = min(chunk, int(free * FREE_FRACTION) // PrefillWorkspace.bytes_per_token(cfg))
    chunk = max(MIN_CHUNK, chunk // MIN_CHUNK * MIN_CHUNK)
    return min(chunk, max(n_tokens, 1))


def _workspace(engine, chunk: int) -> tuple[PrefillWorkspace, int]:
    """A workspace for `chunk` tokens; on OOM shrink the chunk (halving) instead of failing."""
    ws = getattr(engine, "prefill_workspace", None)
    if ws is not None and ws.capacity >= chunk:
        return ws, chunk
    while True:
        engine.prefill_workspace = None
        ws = None
        try:
            ws = PrefillWorkspace(engine.config, chunk, engine.device)
            engine.prefill_workspace = ws
            return ws, chunk
        except torch.OutOfMemoryError:
            if chunk <= MIN_CHUNK:
                raise
            chunk = max(MIN_CHUNK, chunk // 2 // MIN_CHUNK * MIN_CHUNK)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def gemm_mode(engine) -> str:
    mode = getattr(engine, "prefill_gemm", None) or os.environ.get("TOKENGATE_PREFILL_GEMM", "auto")
    if mode not in GEMM_MODES:
        raise ValueError(f"prefill GEMM mode {mode!r}; choose one of {GEMM_MODES}")
    return mode


def _dequant_scratch(engine, w) -> torch.Tensor:
    """bf16 [rows, cols] view of the shared per-engine matrix scratch holding `w` dequantized."""
    need = w.rows * w.cols
    buf = getattr(engine, "prefill_matrix_scratch", None)
    if buf is None or buf.numel() < need:
        engine.prefill_matrix_scratch = None
        biggest = max(m.rows * m.cols for n, m in engine.weights.mat.items() if n.startswith("blk."))
        buf = torch.empty(max(need, biggest), dtype=torch.bfloat16, device=engine.device)
        engine.prefill_matrix_scratch = buf
    return dequantize_matrix(w.data, w.qtype, w.cols, out=buf[:need].view(w.rows, w.cols))


def _use_scratch(engine, m: int) -> bool:
    mode = gemm_mode(engine)
    return m >= 64 and (mode == "scratch" or (mode == "auto" and m >= SCRATCH_MIN_M))


def _mm(engine, name: str, x: torch.Tensor, out: torch.Tensor, residual: torch.Tensor | None = None):
    w = engine.weights.mat[name]
    if not _use_scratch(engine, x.shape[0]):
        return qgemm(x, w.data, w.qtype, w.cols, out=out, residual=residual)
    y = x.to(torch.bfloat16) @ _dequant_scratch(engine, w).t()
    if residual is not None:
        if residual.data_ptr() != out.data_ptr():
            out.copy_(residual)
        out.add_(y)
    else:
        out.copy_(y)
    return out


def _gdn_layer(engine, p: str, i: int, ws: PrefillWorkspace, n: int) -> None:
    cfg, vec = engine.config, engine.weights.vec
    xn, hv = ws.xn[:n], cfg.n_v_head
    _mm(engine, p + "attn_qkv.weight", xn, ws.u_raw[:n])
    _mm(engine, p + "attn_gate.weight", xn, ws.z[:n])
    _mm(engine, p + "ssm_alpha.weight", xn, ws.ab[:n, :hv])
    _mm(engine, p + "ssm_beta.weight", xn, ws.ab[:n, hv:])
    gdn_conv(ws.u_raw[:n], vec[p + "ssm_conv1d.weight"], engine.state.conv[i], out=ws.u_conv[:n])
    gdn_chunk(ws.u_conv[:n], ws.ab[:n, :hv], ws.ab[:n, hv:], vec[p + "ssm_a"], vec[p + "ssm_dt.bias"],
              engine.state.ssm[i], n_k_head=cfg.n_k_head, out=ws.o[:n], scratch=ws.gdn)
    gated_norm(ws.o[:n], ws.z[:n], vec[p + "ssm_norm.weight"], cfg.rms_eps, out=ws.y[:n])
    _mm(engine, p + "ssm_out.weight", ws.y[:n], ws.h[:n], residual=ws.h[:n])


def _attn_layer(engine, p: str, i: int, ws: PrefillWorkspace, n: int, pos0: int, cos, sin) -> None:
    cfg, vec = engine.config, engine.weights.vec
    xn = ws.xn[:n]
    _mm(engine, p + "attn_q.weight", xn, ws.qg[:n])
    _mm(engine, p + "attn_k.weight", xn, ws.k[:n])
    _mm(engine, p + "attn_v.weight", xn, ws.v[:n])
    kc, vc = engine.state.k_cache[i], engine.state.v_cache[i]
    attn_prep(ws.qg[:n], ws.k[:n], ws.v[:n], vec[p + "attn_q_norm.weight"], vec[p + "attn_k_norm.weight"],
              cos, sin, kc, vc, pos0, cfg.rms_eps, out=ws.q[:n])
    flash_attn(ws.q[:n], ws.qg[:n], kc, vc, pos0, out=ws.attn[:n])
    _mm(engine, p + "attn_output.weight", ws.attn[:n], ws.h[:n], residual=ws.h[:n])


def _ffn(engine, p: str, ws: PrefillWorkspace, n: int) -> None:
    if engine.config.is_moe:
        from .moe import prefill_ffn

        prefill_ffn(engine, p, ws.xn[:n], ws.h[:n], ws.act[:n])
        return
    mat = engine.weights.mat
    g, u = mat[p + "ffn_gate.weight"], mat[p + "ffn_up.weight"]
    if not _use_scratch(engine, n):
        qgemm_swiglu(ws.xn[:n], g.data, g.qtype, u.data, u.qtype, g.cols, out=ws.act[:n])
    else:
        gate = ws.xn[:n] @ _dequant_scratch(engine, g).t()
        torch.nn.functional.silu(gate, inplace=True)
        gate.mul_(ws.xn[:n] @ _dequant_scratch(engine, u).t())
        ws.act[:n].copy_(gate)
    _mm(engine, p + "ffn_down.weight", ws.act[:n], ws.h[:n], residual=ws.h[:n])


_GDN_BUFS = ("u_raw", "z", "ab", "u_conv", "o", "y")
_ATTN_BUFS = ("qg", "k", "v", "q", "attn")


def _probe(ws: PrefillWorkspace, n: int, where: str, bufs: tuple[str, ...]) -> None:
    """Diagnostics (engine.prefill_debug): raise naming the first step whose buffers hold non-finite
    values, and which. Only the buffers that step wrote are checked (the others still hold an
    earlier chunk's or layer's values, or were never written). Synchronises: for debugging only."""
    bad = [b for b in ("h", *bufs) if not bool(torch.isfinite(getattr(ws, b)[:n]).all())]
    if bad:
        rows = torch.nonzero(~torch.isfinite(ws.h[:n]).reshape(n, -1).all(dim=1)).flatten()[:8].tolist()
        raise FloatingPointError(f"non-finite after {where} (n={n}): buffers {bad}; first residual rows {rows}")


def _forward_chunk(engine, ids: torch.Tensor, ws: PrefillWorkspace, pos0: int) -> None:
    """Run every layer on one chunk; leaves the final residual stream in ws.h[:n]."""
    cfg, vec = engine.config, engine.weights.vec
    n = ids.shape[0]
    emb = engine.weights.mat["token_embd.weight"]
    gather_rows(emb.data, emb.qtype, ids, cfg.d_model, out=ws.h[:n], ids_checked=True)  # prefill_forward did
    debug = bool(getattr(engine, "prefill_debug", False))
    if debug:
        _probe(ws, n, f"embedding (pos0={pos0})", ())
    cos = sin = None
    if cfg.attention_layers:
        cos, sin = rope_tables(torch.arange(pos0, pos0 + n, device=ids.device), cfg.rope_dims, cfg.rope_base)
    i_gdn = i_attn = 0
    for layer in range(cfg.n_layers):
        p = f"blk.{layer}."
        rmsnorm(ws.h[:n], vec[p + "attn_norm.weight"], cfg.rms_eps, out=ws.xn[:n])
        if cfg.is_attention(layer):
            _attn_layer(engine, p, i_attn, ws, n, pos0, cos, sin)
            i_attn += 1
            mixer_bufs = _ATTN_BUFS
        else:
            _gdn_layer(engine, p, i_gdn, ws, n)
            i_gdn += 1
            mixer_bufs = _GDN_BUFS
        if debug:
            _probe(ws, n, f"layer {layer} mixer (pos0={pos0}, gemm {gemm_mode(engine)})", ("xn", *mixer_bufs))
        rmsnorm(ws.h[:n], vec[p + "post_attention_norm.weight"], cfg.rms_eps, out=ws.xn[:n])
        _ffn(engine, p, ws, n)
        if debug:
            _probe(ws, n, f"layer {layer} ffn (pos0={pos0}, gemm {gemm_mode(engine)})", ("xn", "act"))


def _logits(engine, ws: PrefillWorkspace, rows: slice, out: torch.Tensor) -> None:
    """LM head on residual rows `rows` of the workspace into `out` [len(rows), V] fp32."""
    cfg = engine.config
    h = ws.h[rows]
    xn = ws.xn[: h.shape[0]]
    rmsnorm(h, engine.weights.vec["output_norm.weight"], cfg.rms_eps, out=xn)
    head = engine.weights.lm_head
    qgemm(xn, head.data, head.qtype, head.cols, out=out)


def prefill_forward(engine, token_ids, all_logits: bool = False, *, chunk_size: int | None = None) -> torch.Tensor:
    """Consume `token_ids` at engine.position …; return fp32 logits [V] (last token) or [n, V].

    Updates the GDN and KV state in place; the caller advances engine.position by n.
    chunk_size overrides the memory-based chunk plan (tests; any value ≥ 1).
    """
    cfg = engine.config
    ids = torch.as_tensor(token_ids, dtype=torch.int32, device=engine.device).reshape(-1)
    n = ids.shape[0]
    if n == 0:
        raise ValueError("prefill needs at least one token")
    start = engine.position
    if start + n > engine.max_context:
        raise ValueError(f"prefill of {n} tokens at position {start} exceeds max_context {engine.max_context}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= cfg.vocab_size:
        raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}), got min {lo} max {hi}")
    if chunk_size is None:
        chunk_size = getattr(engine, "prefill_chunk", None)
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        chunk = min(chunk_size, n)
    else:
        chunk = plan_chunk(engine, n)
    ws, chunk = _workspace(engine, chunk)

    if prefill_graph.graphable(engine, n, chunk, all_logits):
        graphs = engine.__dict__.setdefault("prefill_graphs", prefill_graph.PrefillGraphs())
        return graphs.run(engine, ids, start, ws, lambda: _eager(engine, ids, ws, start, n, chunk, False))
    return _eager(engine, ids, ws, start, n, chunk, all_logits)


def _eager(engine, ids: torch.Tensor, ws: PrefillWorkspace, start: int, n: int, chunk: int,
           all_logits: bool) -> torch.Tensor:
    cfg = engine.config
    out = torch.empty((n if all_logits else 1), cfg.vocab_size, dtype=torch.float32, device=engine.device)
    for c0 in range(0, n, chunk):
        c1 = min(c0 + chunk, n)
        _forward_chunk(engine, ids[c0:c1], ws, start + c0)
        if all_logits:
            for r0 in range(0, c1 - c0, 256):  # bounded LM-head GEMM per call
                r1 = min(r0 + 256, c1 - c0)
                _logits(engine, ws, slice(r0, r1), out[c0 + r0 : c0 + r1])
        elif c1 == n:
            _logits(engine, ws, slice(c1 - c0 - 1, c1 - c0), out)
    return out if all_logits else out[0]
