"""Open a `qwen35` or `qwen35moe` GGUF file, memory-mapped, and validate everything the model needs.

Every problem surfaces as one `GGUFError` whose message names the file and the fault;
nothing from deep inside numpy or the `gguf` package escapes.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..config import ARCH, MOE_ARCH, ModelConfig, MoeConfig
from . import names
from .header import HeaderError, read_header
from .types import BLOCK, GGMLType, SUPPORTED_TYPES, tensor_nbytes


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


@dataclass(frozen=True)
class _RawTensor:
    """One entry of the tensor table with its bytes: typed for F32/F16, uint8 rows otherwise."""

    name: str
    type_id: int
    shape: tuple[int, ...]  # torch order (GGUF's ne reversed)
    data_offset: int
    data: np.ndarray


# Typed views, as gguf.GGUFReader gives them (every other type is uint8 [rows, row_bytes]).
_TYPED = {GGMLType.F32: np.float32, GGMLType.F16: np.float16}


def _geometry(type_id: int) -> tuple[int, int] | None:
    """(weights per block, bytes per block) of any ggml type gguf knows, None for an unknown id."""
    try:
        return BLOCK[GGMLType(type_id)]
    except (ValueError, KeyError):
        pass
    import gguf

    try:
        return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None


def type_name(type_id: int) -> str:
    try:
        return GGMLType(type_id).name
    except ValueError:
        import gguf

        try:
            return gguf.GGMLQuantizationType(type_id).name
        except ValueError:
            return str(type_id)


def _open(path: Path) -> tuple[dict, dict[str, _RawTensor]]:
    """Metadata and the tensor table (bytes memory-mapped), or the one GGUFError saying why not."""
    if not path.exists():
        raise GGUFError(f"{path}: no such file")
    if not path.is_file():
        raise GGUFError(f"{path}: not a regular file")
    size = path.stat().st_size
    if size < 24:
        raise GGUFError(f"{path}: not a GGUF file (only {size} bytes)")
    with open(path, "rb") as f:
        magic, version = f.read(4), int.from_bytes(f.read(4), "little")
    if magic != b"GGUF":
        raise GGUFError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    if version not in (2, 3) and int.from_bytes(version.to_bytes(4, "little"), "big") in (2, 3):
        raise GGUFError(f"{path}: big-endian GGUF files are not supported")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (expected 2 or 3)")
    mm = np.memmap(path, mode="r")
    try:
        header = read_header(mm)
    except (HeaderError, struct.error, UnicodeError) as e:
        raise GGUFError(f"{path}: unreadable GGUF header ({type(e).__name__}: {e}); file truncated or corrupt?") from None
    tensors: dict[str, _RawTensor] = {}
    for t in header.tensors:
        geo = _geometry(t.type_id)
        if geo is None:
            raise GGUFError(f"{path}: tensor {t.name!r} has unknown ggml type id {t.type_id}")
        per_block, block_bytes = geo
        shape = tuple(reversed(t.dims))
        n_elems = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
        begin = header.data_start + t.offset
        end = begin + n_elems * block_bytes // per_block
        if end > size:
            raise GGUFError(f"{path}: tensor {t.name!r} runs past the end of the file (needs bytes up to {end}, "
                            f"file has {size}); truncated download?")
        typed = _TYPED.get(GGMLType(t.type_id)) if t.type_id in GGMLType._value2member_map_ else None
        if typed is not None:
            data = mm[begin:end].view(typed).reshape(shape)
        else:
            rows = shape[:-1] if shape else ()
            data = mm[begin:end].reshape(*rows, -1) if rows else mm[begin:end]
        tensors[t.name] = _RawTensor(t.name, t.type_id, shape, begin, data)
    return header.metadata, tensors


def _require(meta: dict, key: str, path: Path):
    if key not in meta:
        raise GGUFError(f"{path}: missing metadata key {key!r}")
    return meta[key]


def _int(meta: dict, key: str, path: Path, *, minimum: int = 1, default=None) -> int:
    value = meta.get(key, default) if default is not None else _require(meta, key, path)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise GGUFError(f"{path}: metadata key {key!r} is {value!r}, expected an integer")
    if value < minimum:
        raise GGUFError(f"{path}: metadata key {key!r} is {value}, must be at least {minimum}")
    return int(value)


def _float(meta: dict, key: str, path: Path) -> float:
    value = _require(meta, key, path)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value > 0:
        raise GGUFError(f"{path}: metadata key {key!r} is {value!r}, expected a positive number")
    return float(value)


ARCHS = (ARCH, MOE_ARCH)


def _moe_fields(meta: dict, path: Path) -> dict:
    """The expert keys of a qwen35moe file, with llama.cpp's fallbacks (qwen35moe load_arch_hparams)."""
    k = lambda key, **kw: _int(meta, f"{MOE_ARCH}.{key}", path, **kw)  # noqa: E731
    n_expert, n_used = k("expert_count"), k("expert_used_count")
    if n_used > n_expert:
        raise GGUFError(f"{path}: expert_used_count {n_used} exceeds expert_count {n_expert}")
    n_ff = meta.get(f"{MOE_ARCH}.feed_forward_length")
    n_ff = _int(meta, f"{MOE_ARCH}.feed_forward_length", path) if n_ff is not None else None
    exp_key, sh_key = f"{MOE_ARCH}.expert_feed_forward_length", f"{MOE_ARCH}.expert_shared_feed_forward_length"
    if exp_key in meta:
        d_exp = _int(meta, exp_key, path)
    elif n_ff is not None:
        d_exp = n_ff // n_used  # llama.cpp: n_ff / n_expert_used when the key is absent
    else:
        raise GGUFError(f"{path}: missing metadata key {exp_key!r} (and no feed_forward_length to derive it)")
    if sh_key in meta:
        d_sh = _int(meta, sh_key, path)
    elif n_ff is not None:
        d_sh = n_ff
    else:
        raise GGUFError(f"{path}: missing metadata key {sh_key!r} (and no feed_forward_length to derive it)")
    # The qwen35moe graph hard-codes softmax gating and renormalised top-k; a file asking otherwise
    # would silently run differently here, so refuse it.
    scale = meta.get(f"{MOE_ARCH}.expert_weights_scale")
    if scale is not None and float(scale) not in (0.0, 1.0):
        raise GGUFError(f"{path}: expert_weights_scale {scale} is not supported (expected none, 0 or 1)")
    gating = meta.get(f"{MOE_ARCH}.expert_gating_func")
    if gating is not None and int(gating) != 1:
        raise GGUFError(f"{path}: expert_gating_func {gating} is not supported (qwen35moe routes with softmax = 1)")
    return {"n_expert": n_expert, "n_expert_used": n_used, "d_ffn_exp": d_exp, "d_ffn_shexp": d_sh,
            "d_ffn": n_ff if n_ff is not None else d_sh}


def config_from_metadata(meta: dict, tensor_names: set[str], path: Path) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise GGUFError(f"{path}: architecture is {arch!r}, expected {ARCH!r} or {MOE_ARCH!r}")
    k = lambda key, **kw: _int(meta, f"{arch}.{key}", path, **kw)  # noqa: E731
    n_blocks = k("block_count")
    n_layers = n_blocks - k("nextn_predict_layers", minimum=0, default=0)  # §8.6
    if n_layers < 1:
        raise GGUFError(f"{path}: block_count {n_blocks} leaves no main-stack layers after nextn_predict_layers")
    d_state = k("ssm.state_size")
    n_v_head = k("ssm.time_step_rank")
    inner = k("ssm.inner_size")
    if inner != n_v_head * d_state:
        raise GGUFError(
            f"{path}: ssm.inner_size {inner} != ssm.time_step_rank {n_v_head} x ssm.state_size {d_state} (dk must equal dv)"
        )
    key_len, val_len = k("attention.key_length"), k("attention.value_length")
    if key_len != val_len:
        raise GGUFError(f"{path}: attention.key_length {key_len} != value_length {val_len}")
    vocab = meta.get(f"{arch}.vocab_size")
    if vocab is None:
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else None
    moe = _moe_fields(meta, path) if arch == MOE_ARCH else {}
    kind = MoeConfig if moe else ModelConfig
    return kind(
        n_layers=n_layers,
        d_model=k("embedding_length"),
        d_ffn=moe.pop("d_ffn") if moe else k("feed_forward_length"),
        vocab_size=int(vocab) if vocab is not None else -1,  # fixed up from token_embd below
        n_head=k("attention.head_count"),
        n_kv_head=k("attention.head_count_kv"),
        n_k_head=k("ssm.group_count"),
        n_v_head=n_v_head,
        head_dim=key_len,
        ssm_head_dim=d_state,
        conv_kernel=k("ssm.conv_kernel"),
        rope_dims=k("rope.dimension_count", minimum=0),
        rope_base=_float(meta, f"{arch}.rope.freq_base", path),
        rms_eps=_float(meta, f"{arch}.attention.layer_norm_rms_epsilon", path),
        full_attention_interval=k("full_attention_interval", default=4),
        tied_embeddings="output.weight" not in tensor_names,
        context_length=k("context_length", default=262144),
        name=str(meta.get("general.name", "gguf")),
        **moe,
    )


def load_gguf(path: str | os.PathLike) -> GGUFModel:
    """Open and validate a qwen35 / qwen35moe GGUF. Raises GGUFError naming the first problem found."""
    path = Path(path)
    meta, raw = _open(path)
    file_size = path.stat().st_size
    cfg = config_from_metadata(meta, set(raw), path)

    emb = raw.get("token_embd.weight")
    if emb is None:
        raise GGUFError(f"{path}: missing tensor 'token_embd.weight'")
    vocab_from_tensor = int(emb.shape[0]) if len(emb.shape) > 1 else -1
    if cfg.vocab_size in (-1, None) or cfg.vocab_size != vocab_from_tensor:
        cfg = replace(cfg, vocab_size=vocab_from_tensor)

    tensors: dict[str, QTensor] = {}
    for name, want_shape in names.expected_tensors(cfg).items():
        t = raw.get(name)
        if t is None:
            raise GGUFError(f"{path}: missing tensor {name!r}")
        try:
            ttype = GGMLType(t.type_id)
        except ValueError:
            ttype = None
        if ttype not in SUPPORTED_TYPES:
            raise GGUFError(
                f"{path}: tensor {name!r} has unsupported type {type_name(t.type_id)}; supported: "
                + ", ".join(x.name for x in SUPPORTED_TYPES)
            )
        shape = t.shape
        if name.endswith("ffn_gate_inp_shexp.weight") and shape == (1, *want_shape):
            shape = want_shape  # convert_hf_to_gguf keeps HF's [1, d]; llama.cpp reads it as [d]
        if shape != want_shape:
            raise GGUFError(f"{path}: tensor {name!r} has shape {list(shape)}, expected {list(want_shape)}")
        need = tensor_nbytes(ttype, shape)
        if t.data_offset + need > file_size or t.data.nbytes != need:
            raise GGUFError(f"{path}: tensor {name!r} runs past the end of the file (truncated download?)")
        tensors[name] = QTensor(name, ttype, shape, t.data)
    return GGUFModel(path=path, config=cfg, tensors=tensors, metadata=meta, file_type=meta.get("general.file_type"))
