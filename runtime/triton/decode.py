"""One decode token through the whole model as a fixed sequence of kernel launches.

Everything the step touches is preallocated (DecodeBuffers) and the position lives in a
device int32 scalar that the kernels read and the last kernel advances, so the same launch
sequence can be captured once in a CUDA graph and replayed for every token.

Launches per layer: GDN = fused in-projection GEMV (norm + conv/SiLU) -> recurrence ->
out-projection GEMV (+residual); attention = q/k/v GEMV (norm) -> prep -> split-K partials ->
combine (+gate) -> o-projection GEMV (+residual); then FFN = gate/up SwiGLU GEMV (norm) ->
down GEMV (+residual). Final: LM head GEMV (norm) -> two-stage argmax (advances the position).
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from ..kernels.argmax import ArgmaxWorkspace, argmax_to
from ..kernels.attn_decode import AttnConfig, AttnWorkspace, attention_decode
from ..kernels.embed import embed
from ..kernels.gdn_decode import gdn_decode_step
from ..kernels.gemv import AutoTile, GemvConfig, TileTable, gemv
from ..kernels.gemv.kernel import resolve_config
from ..kernels.gemv.tiles import default_config
from ..kernels.moe_experts import DEFAULT_EXPERT_TILE, ExpertTile, default_expert_tile
from ..kernels.quant_x import Q8Vector
from .moe import MoeDecodeBuffers, decode_ffn as moe_decode_ffn
from .weights import DeviceWeights


class DecodeState:
    """Per-sequence state, preallocated for max_context (layout: docs in runtime/triton/engine.py)."""

    def __init__(self, cfg: ModelConfig, max_context: int, device, kv_dtype=torch.bfloat16):
        f32 = dict(dtype=torch.float32, device=device)
        self.max_context = max_context
        self.conv = [torch.zeros(cfg.conv_kernel - 1, cfg.conv_channels, **f32) for _ in cfg.deltanet_layers]
        self.ssm = [torch.zeros(cfg.n_v_head, cfg.ssm_head_dim, cfg.ssm_head_dim, **f32) for _ in cfg.deltanet_layers]
        kv = (max_context, cfg.n_kv_head, cfg.head_dim)
        self.k_cache = [torch.zeros(kv, dtype=kv_dtype, device=device) for _ in cfg.attention_layers]
        self.v_cache = [torch.zeros(kv, dtype=kv_dtype, device=device) for _ in cfg.attention_layers]
        self.pos = torch.zeros(1, dtype=torch.int32, device=device)  # device copy of the position

    def tensors(self) -> list[torch.Tensor]:
        return [*self.conv, *self.ssm, *self.k_cache, *self.v_cache]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def zero_(self) -> None:
        for t in (*self.conv, *self.ssm):
            t.zero_()
        self.pos.zero_()


class DecodeBuffers:
    """Activations of one decode step (static addresses for the CUDA graph)."""

    def __init__(self, cfg: ModelConfig, max_context: int, device, n_split: int):
        f32 = dict(dtype=torch.float32, device=device)
        self.token = torch.zeros(1, dtype=torch.int32, device=device)
        self.history = torch.zeros(max_context + 1, dtype=torch.int32, device=device)  # token consumed at each position
        self.h = torch.zeros(1, cfg.d_model, **f32)  # residual stream (fp32)
        self.proj_gdn = torch.zeros(cfg.conv_channels + cfg.value_dim + 2 * cfg.n_v_head, **f32)
        self.proj_attn = torch.zeros(cfg.q_proj_dim + 2 * cfg.kv_proj_dim, **f32)
        self.y_gdn = torch.zeros(cfg.value_dim, **f32)
        self.o_attn = torch.zeros(cfg.n_head * cfg.head_dim, **f32)
        self.ffn = torch.zeros(cfg.d_ffn, **f32)
        self.logits = torch.zeros(cfg.vocab_size, **f32)
        self.gdn_ssq = torch.zeros(cfg.n_v_head * cfg.ssm_head_dim, **f32)  # split GDN step: partial sums of o^2
        self.attn = AttnWorkspace(cfg.n_head, cfg.head_dim, n_split, device)
        # int8 blocks of the current GEMV input (GemvConfig.x8 launches), sized for the widest
        self.q8 = Q8Vector.empty(max(cfg.d_model, cfg.d_ffn, cfg.value_dim, cfg.n_head * cfg.head_dim), device)
        self.argmax = ArgmaxWorkspace(cfg.vocab_size, device)
        self.moe = MoeDecodeBuffers(cfg, device) if cfg.is_moe else None


class DecodeStep:
    """The launch sequence for one token; `__call__` runs it eagerly (what the graph captures)."""

    def __init__(self, w: DeviceWeights, state: DecodeState, bufs: DecodeBuffers, *,
                 gemv_config: GemvConfig | AutoTile | TileTable | None = None, attn_config: AttnConfig | None = None,
                 gdn_block_v: int | None = None, gdn_pdl: bool | None = None, pdl: bool = False,
                 expert_tile: ExpertTile | None = None):
        self.w, self.s, self.b, self.cfg = w, state, bufs, w.config
        # the MoE's routed-expert GEMVs (runtime/kernels/moe_experts); None: the default for this model's widths
        self.expert_tile = expert_tile or (default_expert_tile(self.cfg.d_ffn_exp, self.cfg.d_ffn_shexp)
                                           if self.cfg.is_moe else DEFAULT_EXPERT_TILE)
        self.gemv_config = default_config(w.device) if gemv_config is None else gemv_config
        self.attn_config = attn_config or AttnConfig()
        self.gdn_block_v = gdn_block_v  # None: one program per value head; else split dv (bench variant)
        if gdn_pdl is None:  # the GDN step launches like its in-projection (measured together, see gemv/tiles.py)
            gdn_pdl = self._in_proj_pdl()
        self.gdn_pdl = gdn_pdl or pdl  # programmatic dependent launch of the GDN step
        self.pdl = pdl  # PDL for the attention and argmax kernels too (GEMVs: gemv_config.pdl)

    def _in_proj_matrices(self, layer: int) -> list:
        p = f"blk.{layer}."
        return [self.w.mat[p + n] for n in ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight")]

    def _in_proj_pdl(self) -> bool:
        """Whether the first GDN layer's in-projection GEMV launches with PDL under gemv_config."""
        layer = next((i for i in range(self.cfg.n_layers) if not self.cfg.is_attention(i)), None)
        if layer is None:
            return False
        return resolve_config(self.gemv_config, self._in_proj_matrices(layer), self.w.device).pdl

    def __call__(self) -> None:
        cfg, w, s, b, gc = self.cfg, self.w, self.s, self.b, self.gemv_config
        mat, vec, eps = w.mat, w.vec, cfg.rms_eps
        h = b.h[0]
        embed(w.embedding, b.token, b.h, s.pos, b.history)
        i_gdn = i_attn = 0
        for layer in range(cfg.n_layers):
            p = f"blk.{layer}."
            if cfg.is_attention(layer):
                gemv(h, [mat[p + "attn_q.weight"], mat[p + "attn_k.weight"], mat[p + "attn_v.weight"]], b.proj_attn,
                     norm_weight=vec[p + "attn_norm.weight"], eps=eps, config=gc, q8=b.q8)
                attention_decode(b.proj_attn, vec[p + "attn_q_norm.weight"], vec[p + "attn_k_norm.weight"], s.pos,
                                 s.k_cache[i_attn], s.v_cache[i_attn], b.o_attn, b.attn, n_head=cfg.n_head,
                                 n_kv_head=cfg.n_kv_head, head_dim=cfg.head_dim, rope_dims=cfg.rope_dims,
                                 rope_base=cfg.rope_base, eps=eps, config=self.attn_config, pdl=self.pdl)
                gemv(b.o_attn, [mat[p + "attn_output.weight"]], h, residual=h, config=gc, q8=b.q8)
                i_attn += 1
            else:
                gemv(h, self._in_proj_matrices(layer), b.proj_gdn, norm_weight=vec[p + "attn_norm.weight"], eps=eps,
                     conv_state=s.conv[i_gdn], conv_weight=vec[p + "ssm_conv1d.weight"], config=gc, q8=b.q8)
                gdn_decode_step(b.proj_gdn, s.ssm[i_gdn], vec[p + "ssm_a"], vec[p + "ssm_dt.bias"],
                                vec[p + "ssm_norm.weight"], b.y_gdn, n_k_head=cfg.n_k_head, eps=eps,
                                block_v=self.gdn_block_v, ssq=b.gdn_ssq, pdl=self.gdn_pdl)
                gemv(b.y_gdn, [mat[p + "ssm_out.weight"]], h, residual=h, config=gc, q8=b.q8)
                i_gdn += 1
            if cfg.is_moe:  # routed top-k + gated shared expert, on the device (runtime/triton/moe.py)
                moe_decode_ffn(self, p)
            else:
                gemv(h, [mat[p + "ffn_gate.weight"], mat[p + "ffn_up.weight"]], b.ffn,
                     norm_weight=vec[p + "post_attention_norm.weight"], eps=eps, swiglu=True, config=gc, q8=b.q8)
                gemv(b.ffn, [mat[p + "ffn_down.weight"]], h, residual=h, config=gc, q8=b.q8)
        gemv(h, [w.lm_head], b.logits, norm_weight=vec["output_norm.weight"], eps=eps, config=gc, q8=b.q8)
        argmax_to(b.logits, b.token, b.argmax, s.pos, pdl=self.pdl)  # next greedy token; position += 1


class GraphRunner:
    """Captures a DecodeStep once in a CUDA graph and replays it (no allocation, no host sync)."""

    def __init__(self, step: DecodeStep):
        self.step = step
        self.graph = None

    def capture(self) -> None:
        """Warm up (compiles every kernel) on the live state, undo its effects, then capture."""
        s, b = self.step.s, self.step.b
        saved = [t.clone() for t in (*s.conv, *s.ssm, s.pos, b.token)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.step()
        torch.cuda.current_stream().wait_stream(stream)
        for dst, src in zip((*s.conv, *s.ssm, s.pos, b.token), saved):
            dst.copy_(src)  # the KV row written at pos is rewritten by the next real step
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()
        torch.cuda.synchronize()

    def __call__(self) -> None:
        if self.graph is None:
            self.capture()
        self.graph.replay()
