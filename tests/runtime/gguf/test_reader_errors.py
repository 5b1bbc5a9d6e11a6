"""load_gguf on bad input: always one GGUFError whose message names the file and the fault."""
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from runtime.config import ModelConfig
from runtime.gguf import GGUFError, load_gguf
from runtime.gguf.names import expected_tensors
from tests.paths import TINY

FIXTURE_Q4 = (TINY / "qwen35-tiny4-Q4_K_M.gguf")

# A qwen35 model small enough to write in a millisecond: 3 DeltaNet layers + 1 attention layer.
MICRO = ModelConfig(
    n_layers=4, d_model=64, d_ffn=96, vocab_size=128, n_head=2, n_kv_head=1, n_k_head=1, n_v_head=2,
    head_dim=32, ssm_head_dim=32, conv_kernel=4, rope_dims=16, context_length=512, name="micro",
)  # fmt: skip


def micro_metadata(cfg: ModelConfig) -> dict:
    a = "qwen35."
    return {
        a + "block_count": cfg.n_layers,
        a + "context_length": cfg.context_length,
        a + "embedding_length": cfg.d_model,
        a + "feed_forward_length": cfg.d_ffn,
        a + "attention.head_count": cfg.n_head,
        a + "attention.head_count_kv": cfg.n_kv_head,
        a + "attention.key_length": cfg.head_dim,
        a + "attention.value_length": cfg.head_dim,
        a + "attention.layer_norm_rms_epsilon": cfg.rms_eps,
        a + "rope.freq_base": cfg.rope_base,
        a + "rope.dimension_count": cfg.rope_dims,
        a + "ssm.conv_kernel": cfg.conv_kernel,
        a + "ssm.state_size": cfg.ssm_head_dim,
        a + "ssm.group_count": cfg.n_k_head,
        a + "ssm.time_step_rank": cfg.n_v_head,
        a + "ssm.inner_size": cfg.value_dim,
        a + "full_attention_interval": cfg.full_attention_interval,
    }


def write_micro(path: Path, *, arch="qwen35", edit_meta=None, edit_tensors=None) -> Path:
    """Write a MICRO model (F32 zeros) with gguf.GGUFWriter, after optional edits.

    edit_tensors(tensors, raw_types) may drop/replace arrays and set raw ggml types by name.
    """
    meta = micro_metadata(MICRO)
    if edit_meta:
        edit_meta(meta)
    tensors = {name: np.zeros(shape, dtype=np.float32) for name, shape in expected_tensors(MICRO).items()}
    raw_types: dict = {}
    if edit_tensors:
        edit_tensors(tensors, raw_types)
    w = gguf.GGUFWriter(str(path), arch=arch)
    for key, value in meta.items():
        if isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_uint32(key, value)
    for name, arr in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw_types.get(name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def load_error(path) -> GGUFError:
    with pytest.raises(GGUFError) as info:
        load_gguf(path)
    err = info.value
    assert str(path) in str(err)
    # one clean error: no chained traceback from numpy / gguf internals
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__)
    return err


def test_micro_file_is_valid(tmp_path):
    """The builder itself writes a loadable model, so each failure below is the edit's doing."""
    model = load_gguf(write_micro(tmp_path / "ok.gguf"))
    assert model.config.n_layers == 4 and model.config.attention_layers == [3]
    assert model.config.vocab_size == 128 and model.config.tied_embeddings


def test_wrong_architecture(tmp_path):
    err = load_error(write_micro(tmp_path / "llama.gguf", arch="llama"))
    assert "architecture is 'llama', expected 'qwen35'" in str(err)


@pytest.mark.parametrize("key", ["qwen35.ssm.state_size", "qwen35.embedding_length", "qwen35.block_count"])
def test_missing_metadata_key(tmp_path, key):
    err = load_error(write_micro(tmp_path / "nokey.gguf", edit_meta=lambda m: m.pop(key)))
    assert f"missing metadata key {key!r}" in str(err)


@pytest.mark.parametrize(
    "key, value, fault",
    [
        ("qwen35.full_attention_interval", 0, "is 0, must be at least 1"),
        ("qwen35.block_count", 0, "is 0, must be at least 1"),
        ("qwen35.ssm.conv_kernel", 4.5, "is 4.5, expected an integer"),
        ("qwen35.rope.freq_base", "big", "expected a positive number"),
        ("qwen35.ssm.inner_size", 100, "ssm.inner_size 100 != ssm.time_step_rank 2 x ssm.state_size 32"),
    ],
)
def test_nonsense_metadata_value(tmp_path, key, value, fault):
    err = load_error(write_micro(tmp_path / "badval.gguf", edit_meta=lambda m: m.__setitem__(key, value)))
    assert key.removeprefix("qwen35.") in str(err) and fault in str(err)


def test_missing_tensor(tmp_path):
    err = load_error(write_micro(tmp_path / "notensor.gguf", edit_tensors=lambda t, r: t.pop("blk.1.ffn_up.weight")))
    assert "missing tensor 'blk.1.ffn_up.weight'" in str(err)


def test_wrong_shape(tmp_path):
    def transpose_ffn_up(t, r):
        t["blk.1.ffn_up.weight"] = np.zeros((64, 96), dtype=np.float32)

    err = load_error(write_micro(tmp_path / "shape.gguf", edit_tensors=transpose_ffn_up))
    assert "tensor 'blk.1.ffn_up.weight' has shape [64, 96], expected [96, 64]" in str(err)


def test_unsupported_tensor_type_q4_0(tmp_path):
    def as_q4_0(t, r):  # 96 rows x 64 weights = 2 Q4_0 blocks of 18 bytes per row
        t["blk.0.ffn_gate.weight"] = np.zeros((96, 2 * 18), dtype=np.uint8)
        r["blk.0.ffn_gate.weight"] = gguf.GGMLQuantizationType.Q4_0

    err = load_error(write_micro(tmp_path / "q4_0.gguf", edit_tensors=as_q4_0))
    assert "tensor 'blk.0.ffn_gate.weight' has unsupported type Q4_0" in str(err)


def test_unknown_tensor_type_id(tmp_path):
    path = write_micro(tmp_path / "type99.gguf")
    info = gguf.GGUFReader(str(path)).tensors[0].field  # patch the first tensor's ggml type id
    pos = info.offset + sum(int(p.nbytes) for p in info.parts[:4])
    raw = bytearray(path.read_bytes())
    raw[pos : pos + 4] = (99).to_bytes(4, "little")
    path.write_bytes(raw)
    err = load_error(path)
    assert "unknown ggml type id 99" in str(err)


@pytest.mark.parametrize("keep", ["all_but_100", "half", "header_only"])
def test_truncated_file(tmp_path, keep):
    full = write_micro(tmp_path / "full.gguf").read_bytes()
    n = {"all_but_100": len(full) - 100, "half": len(full) // 2, "header_only": 200}[keep]
    path = tmp_path / "cut.gguf"
    path.write_bytes(full[:n])
    err = load_error(path)
    if keep == "header_only":
        assert "unreadable GGUF header" in str(err) and "truncated" in str(err)
    else:
        assert "runs past the end of the file" in str(err) and f"file has {n}" in str(err)


def test_truncated_copy_of_fixture(tmp_path):
    """A real llama.cpp file cut short, as an interrupted download leaves it."""
    path = tmp_path / "partial.gguf"
    with open(FIXTURE_Q4, "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
        dst.truncate(FIXTURE_Q4.stat().st_size - 4096)
    assert "runs past the end of the file" in str(load_error(path))


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_text("this is a text file, not a model\n" * 4)
    assert "not a GGUF file (magic b'this'" in str(load_error(path))


def test_tiny_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    assert "not a GGUF file (only 0 bytes)" in str(load_error(path))


def test_unsupported_version(tmp_path):
    raw = bytearray(write_micro(tmp_path / "v.gguf").read_bytes())
    raw[4:8] = (99).to_bytes(4, "little")
    path = tmp_path / "v99.gguf"
    path.write_bytes(raw)
    assert "GGUF version 99 is not supported" in str(load_error(path))


def test_nonexistent_path(tmp_path):
    assert "no such file" in str(load_error(tmp_path / "nope.gguf"))


def test_directory_path(tmp_path):
    assert "not a regular file" in str(load_error(tmp_path))
