"""Synthesise a qwen35 / qwen35moe GGUF: plan → metadata + vocabulary → stream every tensor through
init → quantize → write (stream.py makes the chunks on a thread pool, in file order).
Same (shape, quant, seed) → same bytes, whatever the number of workers."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config import ModelConfig, shape as named_shape
from ..gguf.types import GGMLType
from ..gguf.writer import MetaValue, TensorSpec, file_sha256, planned_file_nbytes, write_gguf
from . import init as synth_init
from .plan import FILE_TYPE, QUANTS, plan
from .stream import ChunkStream
from .vocab import Vocab, build_vocab

QUANTIZATION_VERSION = 2
SHAPE_KEY, SEED_KEY = "tokengate.synth.shape", "tokengate.synth.seed"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _size_label(n_params: int) -> str:
    return f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"


def metadata(cfg: ModelConfig, quant: str, vocab: Vocab, seed: int, n_params: int) -> list[MetaValue]:
    """Every key llama.cpp's qwen35 / qwen35moe loader reads (§8.2, §13), general.*, and the tokenizer."""
    p = cfg.arch + "."
    u32 = lambda k, v: MetaValue(k, int(v), "UINT32")  # noqa: E731
    f32 = lambda k, v: MetaValue(k, float(v), "FLOAT32")  # noqa: E731
    if cfg.is_moe:  # no feed_forward_length: llama.cpp's qwen35moe reads the two expert widths
        ffn = [u32(p + "expert_count", cfg.n_expert), u32(p + "expert_used_count", cfg.n_expert_used),
               u32(p + "expert_feed_forward_length", cfg.d_ffn_exp),
               u32(p + "expert_shared_feed_forward_length", cfg.d_ffn_shexp)]
    else:
        ffn = [u32(p + "feed_forward_length", cfg.d_ffn)]
    return [
        MetaValue("general.type", "model", "STRING"),
        MetaValue("general.name", f"tokengate-synthetic-{cfg.arch}-{cfg.name}-seed{seed}", "STRING"),
        MetaValue("general.size_label", _size_label(n_params), "STRING"),
        u32(p + "block_count", cfg.n_layers),
        u32(p + "context_length", cfg.context_length),
        u32(p + "embedding_length", cfg.d_model),
        *ffn,
        u32(p + "attention.head_count", cfg.n_head),
        u32(p + "attention.head_count_kv", cfg.n_kv_head),
        MetaValue(p + "rope.dimension_sections", [11, 11, 10, 0], "ARRAY", "INT32"),
        f32(p + "rope.freq_base", cfg.rope_base),
        f32(p + "attention.layer_norm_rms_epsilon", cfg.rms_eps),
        u32(p + "attention.key_length", cfg.head_dim),
        u32(p + "attention.value_length", cfg.head_dim),
        u32("general.file_type", FILE_TYPE[quant]),
        u32(p + "ssm.conv_kernel", cfg.conv_kernel),
        u32(p + "ssm.state_size", cfg.ssm_head_dim),
        u32(p + "ssm.group_count", cfg.n_k_head),
        u32(p + "ssm.time_step_rank", cfg.n_v_head),
        u32(p + "ssm.inner_size", cfg.value_dim),
        u32(p + "full_attention_interval", cfg.full_attention_interval),
        u32(p + "rope.dimension_count", cfg.rope_dims),
        u32("general.quantization_version", QUANTIZATION_VERSION),
        MetaValue("tokenizer.ggml.model", "gpt2", "STRING"),
        MetaValue("tokenizer.ggml.pre", "qwen35", "STRING"),
        MetaValue("tokenizer.ggml.tokens", vocab.tokens, "ARRAY", "STRING"),
        MetaValue("tokenizer.ggml.token_type", vocab.token_types, "ARRAY", "INT32"),
        MetaValue("tokenizer.ggml.merges", vocab.merges, "ARRAY", "STRING"),
        u32("tokenizer.ggml.eos_token_id", vocab.eos_token_id),
        u32("tokenizer.ggml.padding_token_id", vocab.padding_token_id),
        u32("tokenizer.ggml.bos_token_id", vocab.endoftext_id),
        MetaValue("tokenizer.ggml.add_bos_token", False, "BOOL"),
        MetaValue("tokenizer.chat_template", CHAT_TEMPLATE, "STRING"),
        # provenance, so `synth --report` can rebuild sibling quantizations of the same weights
        MetaValue(SHAPE_KEY, cfg.name, "STRING"),
        MetaValue(SEED_KEY, int(seed), "UINT64"),
    ]


@dataclass(frozen=True)
class SynthPlan:
    cfg: ModelConfig
    quant: str
    seed: int
    tensors: list[TensorSpec]
    metadata: list[MetaValue]

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(t.shape)) for t in self.tensors)

    def file_nbytes(self) -> int:
        return planned_file_nbytes(self.cfg.arch, self.metadata, self.tensors)


def make_plan(shape: str | ModelConfig, quant: str, seed: int = 0) -> SynthPlan:
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANTS)}")
    cfg = named_shape(shape) if isinstance(shape, str) else shape
    tensors = [TensorSpec(t.name, t.shape, t.type, t.nbytes) for t in plan(cfg, quant)]
    n_params = sum(int(np.prod(t.shape)) for t in tensors)
    return SynthPlan(cfg, quant, seed, tensors, metadata(cfg, quant, build_vocab(cfg.vocab_size), seed, n_params))


DEFAULT_INFLIGHT_BYTES = 4 << 30  # fp32 bytes of chunks made ahead of the writer


def default_workers() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class SynthResult:
    path: Path
    nbytes: int
    sha256: str
    plan: SynthPlan
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage (see stream.Timings)


def synthesize(
    shape: str | ModelConfig,
    quant: str,
    seed: int,
    out: str | os.PathLike,
    *,
    device: str = "cpu",
    spec: synth_init.InitSpec = synth_init.DEFAULT,
    on_tensor: Callable[[TensorSpec], None] | None = None,
    workers: int | None = None,
    inflight_bytes: int = DEFAULT_INFLIGHT_BYTES,
) -> SynthResult:
    """Write the synthetic model to `out` and return its size and sha256.

    `workers` threads (default: one per CPU) make tensors ahead of the writer, holding at
    most about `inflight_bytes` of them; neither changes a byte of the file."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but torch sees no CUDA device")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    t0 = time.perf_counter()
    p = make_plan(shape, quant, seed)
    stream = ChunkStream(p.tensors, p.cfg, seed, spec, device, workers=workers, inflight_bytes=inflight_bytes)
    try:
        path = write_gguf(out, p.cfg.arch, p.metadata, p.tensors, stream.pieces, on_tensor=on_tensor)
    finally:
        stream.close()
    t_written = time.perf_counter()
    sha = file_sha256(path)
    timings = {**stream.timings.as_dict(), "write_total": round(t_written - t0, 3),
               "sha256": round(time.perf_counter() - t_written, 3)}
    return SynthResult(path, path.stat().st_size, sha, p, timings)
