"""TritonEngine: the docs/protocol.md Engine on Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1).

What prefill (runtime.triton.prefill.prefill_forward(engine, token_ids, all_logits)) may use:
  engine.config            ModelConfig
  engine.weights           DeviceWeights: .mat[name] QWeight (GGUF blocks, uint8 [rows, row_bytes],
                           or typed [rows, cols]), .vec[name] fp32 (norms, ssm_a, ssm_dt.bias,
                           ssm_conv1d [Cc, 4]), .lm_head, .embedding
  engine.state.conv[i]     fp32 [Kc-1, Cc] of the i-th GDN layer (oldest first, raw projections)
  engine.state.ssm[i]      fp32 [Hv, dk, dv] (S[key][value])
  engine.state.k_cache[i]  bf16 [max_context, Hkv, Dh] of the i-th attention layer (K after norm + RoPE)
  engine.state.v_cache[i]  bf16 [max_context, Hkv, Dh]
  engine.position          tokens consumed before this call (prefill reads it; the engine advances it)
prefill_forward consumes tokens at positions engine.position ... and updates the state in place;
it returns fp32 logits [V] (last token) or [n, V]; the engine then advances position.
"""
from __future__ import annotations

import os

import torch

from ..gguf import GGUFModel, load_gguf
from ..kernels.argmax import argmax_to
from ..kernels.attn_decode import AttnConfig, default_n_split
from ..kernels.gemv import AutoTile, GemvConfig, TileTable
from ..kernels.moe_experts import ExpertTile, GroupedTile
from .decode import DecodeBuffers, DecodeState, DecodeStep, GraphRunner
from .weights import DeviceWeights


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class TritonEngine:
    def __init__(self, model: GGUFModel, device="cuda", max_context: int = 32768, *, use_graph: bool | None = None,
                 gemv_config: GemvConfig | AutoTile | TileTable | None = None, attn_config: AttnConfig | None = None,
                 n_split: int | None = None, gdn_block_v: int | None = None, gdn_pdl: bool | None = None,
                 pdl: bool = False, expert_tile: ExpertTile | None = None,
                 grouped_tile: GroupedTile | None = None):
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        if dev.type == "cpu" and not _interpreting():
            raise ValueError("the triton backend runs on CPU only under the Triton interpreter: "
                             "set TRITON_INTERPRET=1 before importing runtime")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"unsupported device {device!r}")
        if not 1 <= max_context:
            raise ValueError(f"max_context must be >= 1, got {max_context}")
        if dev.type == "cuda" and dev.index is not None:
            torch.cuda.set_device(dev)
        self.config = model.config
        self.device = dev
        self.max_context = int(max_context)
        self.weights = DeviceWeights(model, dev)
        if n_split is None:
            n_sm = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
            n_split = default_n_split(self.max_context, n_sm)
        self.state = DecodeState(self.config, self.max_context, dev)
        self.bufs = DecodeBuffers(self.config, self.max_context, dev, n_split)
        self.step = DecodeStep(self.weights, self.state, self.bufs, gemv_config=gemv_config, attn_config=attn_config,
                               gdn_block_v=gdn_block_v, gdn_pdl=gdn_pdl, pdl=pdl, expert_tile=expert_tile)
        self.grouped_tile = grouped_tile  # the MoE prefill's grouped GEMM; None: by the token count
        self.use_graph = (dev.type == "cuda") if use_graph is None else bool(use_graph)
        if self.use_graph and dev.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self._runner = GraphRunner(self.step) if self.use_graph else self.step
        self.position = 0
        self._last_logits: torch.Tensor | None = None

    # -- protocol ---------------------------------------------------------------------
    def _check_room(self, n: int) -> None:
        if n < 1:
            raise ValueError("need at least one token")
        if self.position + n > self.max_context:
            raise ValueError(f"{n} tokens at position {self.position} exceed max_context {self.max_context}")

    def _check_ids(self, ids: torch.Tensor) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")

    def prefill(self, token_ids, *, all_logits: bool = False) -> torch.Tensor:
        ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
        self._check_room(ids.numel())
        self._check_ids(ids)
        try:
            from .prefill import prefill_forward
        except ImportError:
            prefill_forward = None
        if prefill_forward is None:
            if ids.numel() != 1:  # never loop the decode step over a prompt
                raise NotImplementedError("multi-token prefill needs runtime.triton.prefill")
            logits = self.decode(int(ids[0]))
            return logits[None] if all_logits else logits
        logits = prefill_forward(self, ids.to(self.device), all_logits)
        self.position += ids.numel()
        self.state.pos.fill_(self.position)
        self._last_logits = logits[-1] if all_logits else logits
        return logits

    def decode(self, token_id: int) -> torch.Tensor:
        self._check_room(1)
        if not 0 <= int(token_id) < self.config.vocab_size:
            raise ValueError(f"token id {token_id} outside [0, {self.config.vocab_size})")
        self.bufs.token.fill_(int(token_id))
        self._runner()
        self.position += 1
        self._last_logits = self.bufs.logits
        return self.bufs.logits.clone()

    def generate_greedy(self, n: int, logits_out: torch.Tensor | None = None) -> list[int]:
        """`logits_out` (optional, n x vocab float32 on this device): each step's logits are copied into
        it (the harness checks every timed decode step against the reference; one D2D copy per step)."""
        if self._last_logits is None:
            raise ValueError("generate_greedy needs a preceding prefill or decode")
        if n <= 0:
            return []
        self._check_room(n)
        start = self.position
        if self._last_logits is not self.bufs.logits:  # the graph leaves the next token in bufs.token already
            argmax_to(self._last_logits.contiguous(), self.bufs.token, self.bufs.argmax)
        for i in range(n):
            self._runner()  # consumes bufs.token, writes the next argmax back into it
            if logits_out is not None:
                logits_out[i].copy_(self.bufs.logits.reshape(-1))
        self.position += n
        self._last_logits = self.bufs.logits
        return self.bufs.history[start : start + n].tolist()  # the one host sync

    def snapshot(self) -> dict:
        p = self.position
        s = self.state
        return {
            "position": p,
            "conv": [t.clone() for t in s.conv],
            "ssm": [t.clone() for t in s.ssm],
            "k": [t[:p].clone() for t in s.k_cache],
            "v": [t[:p].clone() for t in s.v_cache],
            "last_logits": None if self._last_logits is None else self._last_logits.clone(),
        }

    def restore(self, snap: dict) -> None:
        p = int(snap["position"])
        s = self.state
        for dst, src in zip((*s.conv, *s.ssm), (*snap["conv"], *snap["ssm"]), strict=True):
            dst.copy_(src)
        for dst, src in zip((*s.k_cache, *s.v_cache), (*snap["k"], *snap["v"]), strict=True):
            dst[:p].copy_(src)
        self.position = p
        s.pos.fill_(p)
        self._last_logits = None if snap["last_logits"] is None else snap["last_logits"].clone()

    def reset(self) -> None:
        self.state.zero_()
        self.position = 0
        self._last_logits = None

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def memory_stats(self) -> dict:
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        return {"weights_bytes": self.weights.nbytes, "state_bytes": self.state.nbytes, "peak_bytes": peak}


def load_triton_engine(model_or_path, device="cuda", max_context: int = 32768, **kw) -> TritonEngine:
    """Entry for runtime.engine.load_engine(backend="triton"): a path or an opened GGUFModel."""
    model = model_or_path if isinstance(model_or_path, GGUFModel) else load_gguf(model_or_path)
    return TritonEngine(model, device=device, max_context=max_context, **kw)


load_engine = load_triton_engine  # the name runtime/engine.py (reference helper) calls
