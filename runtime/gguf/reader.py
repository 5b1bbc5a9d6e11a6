"""Open a `qwen35` or `qwen35moe` GGUF file, memory-mapped, and validate everything the model needs.

Every problem surfaces as one `GGUFError` whose message names the file and the fault;
nothing from deep inside numpy or the `gguf` package escapes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..config import ARCH, MOE_ARCH, ModelConfig, MoeConfig
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
    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as e:  # truncated header / tensor table / data, bad value types, ...
        problem = _diagnose_tensor_table(path, size)
        if problem is not None:
            raise GGUFError(f"{path}: {problem}") from None
        raise GGUFError(f"{path}: unreadable GGUF header ({type(e).__name__}: {e}); file truncated or corrupt?") from None


def _diagnose_tensor_table(path: Path, file_size: int) -> str | None:
    """Why gguf could not build the tensors, when header and tensor table themselves parse.

    Re-reads the file without building tensor views, then checks every tensor's type id
    and whether its data fits in the file. None when the header itself is the problem.
    """
    import gguf

    class _TableOnly(gguf.GGUFReader):
        def _build_tensors(self, start_offs, fields):
            self.table = (start_offs, fields)

    try:
        start, fields = _TableOnly(str(path), "r").table
    except Exception:
        return None
    for field in fields:
        _, name_data, _, dims, raw_dtype, offset = field.parts
        name = bytes(name_data).decode("utf-8", "replace")
        try:
            qtype = gguf.GGMLQuantizationType(int(raw_dtype[0]))
            per_block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            return f"tensor {name!r} has unknown ggml type id {int(raw_dtype[0])}"
        end = int(start) + int(offset[0]) + int(np.prod(dims.astype(np.int64))) * block_bytes // per_block
        if end > file_size:
            return (
                f"tensor {name!r} runs past the end of the file (needs bytes up to {end}, file has {file_size}); "
                "truncated download?"
            )
    return None


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
        cfg = replace(cfg, vocab_size=vocab_from_tensor)

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
        if name.endswith("ffn_gate_inp_shexp.weight") and shape == (1, *want_shape):
            shape = want_shape  # convert_hf_to_gguf keeps HF's [1, d]; llama.cpp reads it as [d]
        if shape != want_shape:
            raise GGUFError(f"{path}: tensor {name!r} has shape {list(shape)}, expected {list(want_shape)}")
        need = tensor_nbytes(ttype, shape)
        if t.data_offset + need > file_size or t.data.nbytes != need:
            raise GGUFError(f"{path}: tensor {name!r} runs past the end of the file (truncated download?)")
        tensors[name] = QTensor(name, ttype, shape, t.data)
    return GGUFModel(path=path, config=cfg, tensors=tensors, metadata=meta, file_type=meta.get("general.file_type"))
