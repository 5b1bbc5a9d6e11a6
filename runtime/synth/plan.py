"""Which tensors a synthetic model has, in which ggml type, and how many bytes each takes.

The writer streams tensors in exactly this order, so sizes and types can be checked for the
27B shape without generating a byte of it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..gguf.names import expected_tensors
from ..gguf.types import GGMLType, tensor_nbytes

QUANTS = ("f32", "f16", "bf16", "q8_0", "q4_k_m")

# llama_ftype values written as general.file_type (llama.h).
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k_m": 15, "bf16": 32}


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]  # torch order: [out, in] for matrices
    type: GGMLType
    nbytes: int


def never_quantized(name: str, shape: tuple[int, ...]) -> bool:
    """1-D tensors, norms and the conv kernel stay F32 in every llama.cpp file (§8.3, §8.4)."""
    return len(shape) == 1 or "_norm.weight" in name or "ssm_conv1d" in name


def more_bits_layer(i: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits(i, n): the layers whose attn_v-like and ffn_down get Q6_K."""
    return i < n_layers // 8 or i >= 7 * n_layers // 8 or (i - n_layers // 8) % 3 == 2


def _q4_k_m_type_fallback(name: str, cfg: ModelConfig) -> GGMLType:
    # Used only until runtime.quant.policy lands; same rules (§8.4).
    if name == "output.weight" or (name == "token_embd.weight" and cfg.tied_embeddings):
        return GGMLType.Q6_K
    if name.startswith("blk.") and name.split(".")[2] in ("attn_v", "attn_qkv", "ffn_down"):
        return GGMLType.Q6_K if more_bits_layer(int(name.split(".")[1]), cfg.n_layers) else GGMLType.Q4_K
    return GGMLType.Q4_K


def _q4_k_m_type(name: str, cfg: ModelConfig) -> GGMLType:
    try:
        from ..quant.policy import q4_k_m_type
    except ImportError:
        return _q4_k_m_type_fallback(name, cfg)
    return GGMLType(int(q4_k_m_type(name, cfg)))


def tensor_type(name: str, shape: tuple[int, ...], cfg: ModelConfig, quant: str) -> GGMLType:
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANTS)}")
    if quant == "f32" or never_quantized(name, shape):
        return GGMLType.F32
    return {
        "f16": lambda: GGMLType.F16,
        "bf16": lambda: GGMLType.BF16,
        "q8_0": lambda: GGMLType.Q8_0,
        "q4_k_m": lambda: _q4_k_m_type(name, cfg),
    }[quant]()


def plan(cfg: ModelConfig, quant: str) -> list[PlannedTensor]:
    """Every tensor of the model in file order with its type and byte size."""
    out = []
    for name, shp in expected_tensors(cfg).items():
        t = tensor_type(name, shp, cfg, quant)
        out.append(PlannedTensor(name, shp, t, tensor_nbytes(t, shp)))
    return out


def type_counts(tensors: list[PlannedTensor]) -> dict[str, dict[str, int]]:
    """{"blk.*.ffn_down.weight": {"Q6_K": 12, "Q4_K": 12}, ...}: the anchor JSON's layout."""
    counts: dict[str, dict[str, int]] = {}
    for t in tensors:
        key = "blk.*." + t.name.split(".", 2)[2] if t.name.startswith("blk.") else t.name
        c = counts.setdefault(key, {})
        c[t.type.name] = c.get(t.type.name, 0) + 1
    return counts


def bytes_by_type(tensors: list[PlannedTensor]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tensors:
        out[t.type.name] = out.get(t.type.name, 0) + t.nbytes
    return out
