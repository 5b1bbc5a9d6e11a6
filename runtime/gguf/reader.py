"""Open a `qwen35` GGUF file, memory-mapped, and validate everything the model needs.

Every problem surfaces as one `GGUFError` whose message names the file and the fault;
nothing from deep inside numpy or the `gguf` package escapes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import ARCH, ModelConfig
from . import names
from .types import GGMLType, SUPPORTED_TYPES, tensor_nbytes


class GGUFError(ValueError):
    """A GGUF file that cannot be used as a qwen35 model; the message says why."""


@dataclass(frozen=True)
class QTensor:
    """One tensor as stored: its ggml type, logical shape and raw bytes (a memmap view).

    `shape` is in torch order (outermost first): a matrix is [out_features, in_features],
    i.e. GGUF's `ne` reversed.
    """

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    data: np.ndarray  # uint8 bytes for block types; a typed view for F32/F16/BF16

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dequantize(self, device="cpu"):
        """fp32 torch tensor of `shape` (see runtime.quant.dequantize)."""
        from ..quant import dequantize

        return dequantize(self, device=device)


@dataclass
class GGUFModel:
    path: Path
    config: ModelConfig
    tensors: dict[str, QTensor]
    metadata: dict[str, object]
    file_type: int | None

    def __getitem__(self, name: str) -> QTensor:
        return self.tensors[name]

    def get(self, name: str) -> QTensor | None:
        return self.tensors.get(name)

    @property
    def lm_head_name(self) -> str:
        return "token_embd.weight" if self.config.tied_embeddings else "output.weight"


def _field_value(field):
    try:
        return field.contents()
    except Exception:  # very old gguf: fall back to the raw parts
        return field.parts[field.data[0]].tolist() if field.data else None


def _open(path: Path):
    import gguf

    if not path.exists():
        raise GGUFError(f"{path}: no such file")
    if path.stat().st_size < 24:
        raise GGUFError(f"{path}: not a GGUF file (only {path.stat().st_size} bytes)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as e:  # truncated header / tensor table, bad value types, ...
        raise GGUFError(f"{path}: unreadable GGUF header ({type(e).__name__}: {e}); file truncated or corrupt?") from None


def _require(meta: dict, key: str, path: Path):
    if key not in meta:
        raise GGUFError(f"{path}: missing metadata key {key!r}")
    return meta[key]


def config_from_metadata(meta: dict, tensor_names: set[str], path: Path) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch != ARCH:
        raise GGUFError(f"{path}: architecture is {arch!r}, expected {ARCH!r}")
    k = lambda key: _require(meta, f"{ARCH}.{key}", path)  # noqa: E731
    n_blocks = int(k("block_count"))
    n_layers = n_blocks - int(meta.get(f"{ARCH}.nextn_predict_layers", 0))  # §8.6
    d_state = int(k("ssm.state_size"))
    n_v_head = int(k("ssm.time_step_rank"))
    inner = int(k("ssm.inner_size"))
    if inner != n_v_head * d_state:
        raise GGUFError(
            f"{path}: ssm.inner_size {inner} != ssm.time_step_rank {n_v_head} x ssm.state_size {d_state} (dk must equal dv)"
        )
    key_len, val_len = int(k("attention.key_length")), int(k("attention.value_length"))
    if key_len != val_len:
        raise GGUFError(f"{path}: attention.key_length {key_len} != value_length {val_len}")
    vocab = meta.get(f"{ARCH}.vocab_size")
    if vocab is None:
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else None
    return ModelConfig(
        n_layers=n_layers,
        d_model=int(k("embedding_length")),
        d_ffn=int(k("feed_forward_length")),
        vocab_size=int(vocab) if vocab is not None else -1,  # fixed up from token_embd below
        n_head=int(k("attention.head_count")),
        n_kv_head=int(k("attention.head_count_kv")),
        n_k_head=int(k("ssm.group_count")),
        n_v_head=n_v_head,
        head_dim=key_len,
        ssm_head_dim=d_state,
        conv_kernel=int(k("ssm.conv_kernel")),
        rope_dims=int(k("rope.dimension_count")),
        rope_base=float(k("rope.freq_base")),
        rms_eps=float(k("attention.layer_norm_rms_epsilon")),
        full_attention_interval=int(meta.get(f"{ARCH}.full_attention_interval", 4)),
        tied_embeddings="output.weight" not in tensor_names,
        context_length=int(meta.get(f"{ARCH}.context_length", 262144)),
        name=str(meta.get("general.name", "gguf")),
    )


def load_gguf(path: str | os.PathLike) -> GGUFModel:
    """Open and validate a qwen35 GGUF. Raises GGUFError naming the first problem found."""
    path = Path(path)
    reader = _open(path)
    meta = {name: _field_value(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    file_size = path.stat().st_size
    raw = {t.name: t for t in reader.tensors}
    cfg = config_from_metadata(meta, set(raw), path)

    emb = raw.get("token_embd.weight")
    if emb is None:
        raise GGUFError(f"{path}: missing tensor 'token_embd.weight'")
    vocab_from_tensor = int(emb.shape[1]) if len(emb.shape) > 1 else -1
    if cfg.vocab_size in (-1, None) or cfg.vocab_size != vocab_from_tensor:
        cfg = ModelConfig(**{**cfg.to_dict(), "vocab_size": vocab_from_tensor})

    tensors: dict[str, QTensor] = {}
    for name, want_shape in names.expected_tensors(cfg).items():
        t = raw.get(name)
        if t is None:
            raise GGUFError(f"{path}: missing tensor {name!r}")
        try:
            ttype = GGMLType(int(t.tensor_type))
        except ValueError:
            ttype = None
        if ttype not in SUPPORTED_TYPES:
            tname = getattr(t.tensor_type, "name", str(t.tensor_type))
            raise GGUFError(
                f"{path}: tensor {name!r} has unsupported type {tname}; supported: "
                + ", ".join(x.name for x in SUPPORTED_TYPES)
            )
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if shape != want_shape:
            raise GGUFError(f"{path}: tensor {name!r} has shape {list(shape)}, expected {list(want_shape)}")
        need = tensor_nbytes(ttype, shape)
        if t.data_offset + need > file_size or t.data.nbytes != need:
            raise GGUFError(f"{path}: tensor {name!r} runs past the end of the file (truncated download?)")
        tensors[name] = QTensor(name, ttype, shape, t.data)
    return GGUFModel(path=path, config=cfg, tensors=tensors, metadata=meta, file_type=meta.get("general.file_type"))
