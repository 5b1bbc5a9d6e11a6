"""Tensor-type policy vs what llama.cpp actually produced (fixture file + H200 anchor files)."""
import os
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from runtime.config import SHAPES
from runtime.gguf import GGMLType, load_gguf, tensor_nbytes
from runtime.gguf.names import expected_tensors
from runtime.quant.policy import FILE_TYPE, MIXES, model_nbytes, q4_k_m_type, tensor_type, tensor_types, use_more_bits
from tests.paths import TINY, ANCHOR

FIXTURES = TINY


@pytest.fixture(scope="module")
def anchor():
    return json.loads(ANCHOR.read_text())["q4_k_m_tensor_types"]


def by_pattern(types: dict[str, GGMLType]) -> dict[str, dict[str, int]]:
    out: dict[str, Counter] = defaultdict(Counter)
    for name, t in types.items():
        out[re.sub(r"^blk\.\d+\.", "blk.*.", name)][t.name] += 1
    return {k: dict(v) for k, v in out.items()}


@pytest.mark.parametrize("size", ["0.8b", "4b", "9b", "tiny"])
def test_q4_k_m_types_match_llama_quantize_files(anchor, size):
    cfg, want = SHAPES[size], anchor[size]
    types = tensor_types(cfg, "q4_k_m")
    assert len(types) == want["n_tensors"]
    assert by_pattern(types) == want["types_by_tensor"]
    shapes = expected_tensors(cfg)
    bytes_by_type = Counter()
    for name, t in types.items():
        bytes_by_type[t.name] += tensor_nbytes(t, shapes[name])
    assert dict(bytes_by_type) == want["bytes_by_type"]
    assert FILE_TYPE["q4_k_m"] == want["general.file_type"]


@pytest.mark.parametrize("size", ["0.8b", "4b", "9b"])
def test_model_nbytes_close_to_real_file_size(anchor, size):
    """Tensor bytes only: the real file adds the tokenizer (a few MB), so ours is a bit smaller."""
    ours, real = model_nbytes(SHAPES[size], "q4_k_m"), anchor[size]["file_bytes"]
    assert ours < real
    assert abs(ours - real) / real < 0.02, f"{size}: {ours} vs {real}"


def test_fixture_q4_k_m_types_every_tensor():
    model = load_gguf(FIXTURES / "qwen35-tiny4-Q4_K_M.gguf")
    cfg = model.config
    assert cfg.n_layers == 4 and cfg.tied_embeddings
    for name, qt in model.tensors.items():
        assert q4_k_m_type(name, cfg) == qt.type, name
    # ffn_down gets Q6_K only on layers 2 and 3 (4//8 = 0, 7*4//8 = 3): integer division
    assert [q4_k_m_type(f"blk.{i}.ffn_down.weight", cfg) for i in range(4)] == [GGMLType.Q4_K] * 2 + [GGMLType.Q6_K] * 2
    assert model_nbytes(cfg, "q4_k_m") == sum(qt.nbytes for qt in model.tensors.values())


def test_fixture_f32_sizes():
    model = load_gguf(FIXTURES / "qwen35-tiny4-f32.gguf")
    assert all(qt.type == tensor_type(name, model.config, "f32") == GGMLType.F32 for name, qt in model.tensors.items())
    assert model_nbytes(model.config, "f32") == sum(qt.nbytes for qt in model.tensors.values())
    n_params = json.loads((FIXTURES / "fixture.json").read_text())["n_params"]
    assert model_nbytes(model.config, "f32") == 4 * n_params


@pytest.mark.parametrize(
    "n_layers, layers",
    [
        (24, [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]),
        (32, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]),
        (64, list(range(8)) + list(range(10, 56, 3)) + list(range(56, 64))),
        (4, [2, 3]),
        (8, [0, 3, 6, 7]),
    ],
)
def test_use_more_bits_layers(n_layers, layers):
    assert [i for i in range(n_layers) if use_more_bits(i, n_layers)] == layers


def test_untied_embedding_stays_q4_k_and_output_is_q6_k():
    cfg = SHAPES["9b"]
    assert q4_k_m_type("token_embd.weight", cfg) == GGMLType.Q4_K
    assert q4_k_m_type("output.weight", cfg) == GGMLType.Q6_K
    assert q4_k_m_type("token_embd.weight", SHAPES["4b"]) == GGMLType.Q6_K


@pytest.mark.parametrize("mix, matrix_type", [("q8_0", GGMLType.Q8_0), ("f16", GGMLType.F16), ("bf16", GGMLType.BF16)])
def test_flat_mixes_keep_small_tensors_f32(mix, matrix_type):
    cfg = SHAPES["tiny"]
    types = tensor_types(cfg, mix)
    shapes = expected_tensors(cfg)
    for name, t in types.items():
        small = len(shapes[name]) == 1 or name.endswith("_norm.weight") or "ssm_conv1d" in name
        assert t == (GGMLType.F32 if small else matrix_type), name
    assert types["blk.0.ssm_conv1d.weight"] == GGMLType.F32 and types["blk.3.attn_q_norm.weight"] == GGMLType.F32
    assert types["token_embd.weight"] == types["output.weight"] == matrix_type


def test_mix_sizes_are_ordered():
    cfg = SHAPES["0.8b"]
    sizes = {mix: model_nbytes(cfg, mix) for mix in MIXES}
    assert sizes["q4_k_m"] < sizes["q8_0"] < sizes["f16"] == sizes["bf16"] < sizes["f32"]


def test_bad_names_and_mixes():
    cfg = SHAPES["tiny"]
    with pytest.raises(ValueError, match="not a tensor"):
        q4_k_m_type("blk.99.ffn_down.weight", cfg)
    with pytest.raises(ValueError, match="unknown quantization mix 'q3_k'"):
        tensor_type("token_embd.weight", cfg, "q3_k")
    with pytest.raises(ValueError, match="unknown quantization mix"):
        tensor_type("output_norm.weight", cfg, "q3_k")


def test_rows_not_multiple_of_256_fall_back_like_llama_quantize():
    from runtime.config import with_overrides

    cfg = with_overrides(SHAPES["tiny"], d_ffn=320)  # ffn_down rows are 320 long
    assert q4_k_m_type("blk.0.ffn_down.weight", cfg) == GGMLType.Q8_0  # Q6_K layer -> Q8_0
    with pytest.raises(ValueError, match="row length 320 is not a multiple of 256"):
        q4_k_m_type("blk.1.ffn_down.weight", cfg)  # Q4_K -> Q5_0, which we do not implement
