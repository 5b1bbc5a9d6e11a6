"""Which tensors a synthetic model has, in which ggml type, and how many bytes each takes.

The writer streams tensors in exactly this order, so sizes and types can be checked for the
27B shape without generating a byte of it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..gguf.names import expected_tensors
from ..gguf.types import GGMLType, tensor_nbytes

from ..quant import policy

QUANTS = policy.MIXES
FILE_TYPE = policy.FILE_TYPE  # general.file_type (llama_ftype) per mix


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]  # torch order: [out, in] for matrices
    type: GGMLType
    nbytes: int


def tensor_type(name: str, shape: tuple[int, ...], cfg: ModelConfig, quant: str) -> GGMLType:
    """The type llama.cpp gives `name` in mix `quant` (runtime.quant.policy)."""
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANTS)}")
    return GGMLType(int(policy.tensor_type(name, cfg, quant)))


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
