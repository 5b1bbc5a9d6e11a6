"""Types and sizes of the q4_k_m files, by arithmetic on the writer's own plan (no files)."""
import json
import os
from pathlib import Path

import pytest

from runtime.config import SHAPES
from runtime.synth.factory import make_plan
from runtime.synth.plan import bytes_by_type, plan, type_counts
from tests.paths import ANCHOR

ANCHOR = json.loads(ANCHOR.read_text())["q4_k_m_tensor_types"]


@pytest.mark.parametrize("shape", ["tiny", "0.8b", "4b", "9b"])
def test_q4_k_m_types_match_llama_cpp(shape):
    p = plan(SHAPES[shape], "q4_k_m")
    want = ANCHOR[shape]
    assert len(p) == want["n_tensors"]
    assert type_counts(p) == want["types_by_tensor"]
    assert bytes_by_type(p) == want["bytes_by_type"]


@pytest.mark.parametrize("shape", ["0.8b", "4b", "9b"])
def test_q4_k_m_file_size_within_2_percent(shape):
    size = make_plan(shape, "q4_k_m").file_nbytes()  # header + metadata + vocab + padded tensors
    want = ANCHOR[shape]["file_bytes"]
    assert abs(size - want) / want < 0.02, (size, want)


def test_other_mixes():
    cfg = SHAPES["tiny"]
    for quant, two_d in (("f32", "F32"), ("f16", "F16"), ("bf16", "BF16"), ("q8_0", "Q8_0")):
        types = {t.name: t.type.name for t in plan(cfg, quant)}
        assert types["blk.0.ffn_up.weight"] == two_d and types["output.weight"] == two_d
        assert types["blk.0.ssm_conv1d.weight"] == "F32" and types["blk.0.attn_norm.weight"] == "F32"


def test_unknown_quant_is_a_clear_error():
    with pytest.raises(ValueError, match="q3_k"):
        make_plan("tiny", "q3_k")
