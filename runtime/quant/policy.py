"""Which ggml type each tensor gets in a given quantization mix, and what the file weighs.

`q4_k_m` reproduces stock `llama-quantize … Q4_K_M` (no imatrix) for qwen35 files
(architecture reference §8.4); `q8_0` reproduces `llama-quantize … Q8_0`; `f32`/`f16`/`bf16`
reproduce convert_hf_to_gguf's output types. Verified against llama.cpp's own files
(fixture + bench/anchors/llamacpp-h200-anchor.json) in tests/runtime/quant/test_policy.py.
"""
from __future__ import annotations

import re
from functools import lru_cache

from ..config import ModelConfig
from ..gguf import names
from ..gguf.types import BLOCK, GGMLType, tensor_nbytes

MIXES = ("f32", "f16", "bf16", "q8_0", "q4_k_m")

# general.file_type (llama_ftype) written by llama.cpp for each mix.
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k_m": 15, "bf16": 32}

_LAYER = re.compile(r"^blk\.(\d+)\.")


@lru_cache(maxsize=32)
def _shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return names.expected_tensors(cfg)


def _shape_of(name: str, cfg: ModelConfig) -> tuple[int, ...]:
    try:
        return _shapes(cfg)[name]
    except KeyError:
        raise ValueError(f"{name!r} is not a tensor of a {cfg.arch} model with this config") from None


def is_quantizable(name: str, shape: tuple[int, ...]) -> bool:
    """llama-quantize's rule: 2-D+ tensors named *weight, except norms, the GDN conv and the MoE router
    (`ffn_gate_inp`; convert_hf_to_gguf also keeps it and the 1-D shared-expert gate in F32)."""
    return (
        name.endswith("weight")
        and len(shape) >= 2
        and "_norm.weight" not in name
        and "ssm_conv1d.weight" not in name
        and "ffn_gate_inp.weight" not in name
    )


# ffn_down-like tensors: llama-quantize's category is "name contains ffn_down", so the routed and the
# shared experts' down projections of a qwen35moe layer both take the layer's Q6_K upgrade (for an
# MoE the layer comes from the name, not a counter).
_FFN_DOWN = ("ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's layer pick for the Q6_K upgrade; n/8 and 7n/8 are C integer divisions."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _layer_index(name: str) -> int:
    m = _LAYER.match(name)
    if m is None:
        raise ValueError(f"{name!r} has no layer index")
    return int(m.group(1))


def _fallback(gtype: GGMLType, name: str, row: int) -> GGMLType:
    """llama-quantize swaps K-quants for 32-block types when a row is not a multiple of 256."""
    if row % BLOCK[gtype][0] == 0:
        return gtype
    if gtype == GGMLType.Q6_K and row % 32 == 0:
        return GGMLType.Q8_0
    raise ValueError(
        f"{name!r}: row length {row} is not a multiple of {BLOCK[gtype][0]}; llama-quantize would fall back "
        f"to a type this runtime does not implement"
    )


def q4_k_m_type(name: str, cfg: ModelConfig) -> GGMLType:
    """The type stock llama-quantize Q4_K_M gives tensor `name` of a qwen35 model `cfg`."""
    shape = _shape_of(name, cfg)
    if not is_quantizable(name, shape):
        return GGMLType.F32
    row = shape[-1]
    is_output = name == "output.weight" or (cfg.tied_embeddings and name == "token_embd.weight")
    if is_output:
        gtype = GGMLType.Q6_K
    elif name.endswith("attn_v.weight") or name.endswith("attn_qkv.weight") or name.endswith(_FFN_DOWN):
        # llama.cpp counts attn_v-like (attn_v + attn_qkv) and ffn_down tensors in file order;
        # a qwen35 layer has exactly one of each, so the counter is the layer index.
        more = use_more_bits(_layer_index(name), cfg.n_layers)
        gtype = GGMLType.Q6_K if more else GGMLType.Q4_K
    else:
        gtype = GGMLType.Q4_K
    return _fallback(gtype, name, row)


def tensor_type(name: str, cfg: ModelConfig, mix: str) -> GGMLType:
    """The type tensor `name` gets in quantization mix `mix` (one of MIXES)."""
    mix = mix.lower()
    if mix == "q4_k_m":
        return q4_k_m_type(name, cfg)
    shape = _shape_of(name, cfg)
    if mix == "f32" or not is_quantizable(name, shape):
        if mix not in MIXES:
            raise ValueError(f"unknown quantization mix {mix!r}; choose one of {', '.join(MIXES)}")
        return GGMLType.F32
    if mix == "f16":
        return GGMLType.F16
    if mix == "bf16":
        return GGMLType.BF16
    if mix == "q8_0":
        if shape[-1] % 32:
            raise ValueError(f"{name!r}: row length {shape[-1]} is not a multiple of the Q8_0 block size 32")
        return GGMLType.Q8_0
    raise ValueError(f"unknown quantization mix {mix!r}; choose one of {', '.join(MIXES)}")


def tensor_types(cfg: ModelConfig, mix: str) -> dict[str, GGMLType]:
    """name -> type for every tensor of the model, in file order."""
    return {name: tensor_type(name, cfg, mix) for name in _shapes(cfg)}


def model_nbytes(cfg: ModelConfig, mix: str) -> int:
    """Bytes of tensor data in a `mix` file of `cfg` (excludes header, metadata and padding)."""
    shapes = _shapes(cfg)
    return sum(tensor_nbytes(t, shapes[name]) for name, t in tensor_types(cfg, mix).items())
