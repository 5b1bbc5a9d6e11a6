"""load_gguf on qwen35moe files: llama.cpp's expert keys and tensor names, one clean GGUFError per fault."""
from pathlib import Path

import gguf
import numpy as np
import pytest

from runtime.config import MoeConfig
from runtime.gguf import GGUFError, load_gguf
from runtime.gguf.names import expected_tensors

# 3 DeltaNet + 1 attention layer, 4 experts of width 32 (F32 zeros: written in a millisecond).
MICRO = MoeConfig(
    n_layers=4, d_model=64, d_ffn=48, vocab_size=128, n_head=2, n_kv_head=1, n_k_head=1, n_v_head=2,
    head_dim=32, ssm_head_dim=32, conv_kernel=4, rope_dims=16, context_length=512, name="micro-moe",
    n_expert=4, n_expert_used=2, d_ffn_exp=32, d_ffn_shexp=48,
)  # fmt: skip
A = "qwen35moe."


def micro_metadata(cfg: MoeConfig) -> dict:
    return {
        A + "block_count": cfg.n_layers, A + "context_length": cfg.context_length,
        A + "embedding_length": cfg.d_model, A + "attention.head_count": cfg.n_head,
        A + "attention.head_count_kv": cfg.n_kv_head, A + "attention.key_length": cfg.head_dim,
        A + "attention.value_length": cfg.head_dim, A + "attention.layer_norm_rms_epsilon": cfg.rms_eps,
        A + "rope.freq_base": cfg.rope_base, A + "rope.dimension_count": cfg.rope_dims,
        A + "ssm.conv_kernel": cfg.conv_kernel, A + "ssm.state_size": cfg.ssm_head_dim,
        A + "ssm.group_count": cfg.n_k_head, A + "ssm.time_step_rank": cfg.n_v_head,
        A + "ssm.inner_size": cfg.value_dim, A + "full_attention_interval": cfg.full_attention_interval,
        A + "expert_count": cfg.n_expert, A + "expert_used_count": cfg.n_expert_used,
        A + "expert_feed_forward_length": cfg.d_ffn_exp, A + "expert_shared_feed_forward_length": cfg.d_ffn_shexp,
    }  # fmt: skip


def write_micro(path: Path, *, arch="qwen35moe", edit_meta=None, edit_tensors=None) -> Path:
    meta = micro_metadata(MICRO)
    if edit_meta:
        edit_meta(meta)
    tensors = {n: np.zeros(s, dtype=np.float32) for n, s in expected_tensors(MICRO).items()}
    if edit_tensors:
        edit_tensors(tensors)
    w = gguf.GGUFWriter(str(path), arch=arch)
    for key, value in meta.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(key, value)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def load_error(path) -> str:
    with pytest.raises(GGUFError) as info:
        load_gguf(path)
    err = info.value
    assert str(path) in str(err) and (err.__context__ is None or err.__suppress_context__)
    return str(err)


def test_micro_moe_loads_with_the_expert_fields(tmp_path):
    m = load_gguf(write_micro(tmp_path / "ok.gguf"))
    c = m.config
    assert c.is_moe and c.arch == "qwen35moe" and c.attention_layers == [3]
    assert (c.n_expert, c.n_expert_used, c.d_ffn_exp, c.d_ffn_shexp) == (4, 2, 32, 48)
    assert m["blk.2.ffn_down_exps.weight"].shape == (4, 64, 32)  # [n_expert, d, F]: ne {F, d, E} reversed
    assert m["blk.2.ffn_gate_exps.weight"].shape == (4, 32, 64)
    assert "blk.0.ffn_gate.weight" not in m.tensors


def test_shared_gate_as_hf_writes_it_1_by_d(tmp_path):
    def as_row(t):
        t["blk.1.ffn_gate_inp_shexp.weight"] = np.ones((1, 64), dtype=np.float32)

    m = load_gguf(write_micro(tmp_path / "row.gguf", edit_tensors=as_row))
    assert m["blk.1.ffn_gate_inp_shexp.weight"].shape == (64,)
    assert float(m["blk.1.ffn_gate_inp_shexp.weight"].dequantize().sum()) == 64.0


def test_expert_widths_fall_back_to_feed_forward_length_like_llama_cpp(tmp_path):
    def legacy(meta):
        meta.pop(A + "expert_feed_forward_length")
        meta.pop(A + "expert_shared_feed_forward_length")
        meta[A + "feed_forward_length"] = 64  # n_ff_exp = 64 / 2 = 32, n_ff_shexp = 64

    def shared64(t):
        for i in range(4):
            t[f"blk.{i}.ffn_gate_shexp.weight"] = np.zeros((64, 64), np.float32)
            t[f"blk.{i}.ffn_up_shexp.weight"] = np.zeros((64, 64), np.float32)
            t[f"blk.{i}.ffn_down_shexp.weight"] = np.zeros((64, 64), np.float32)

    c = load_gguf(write_micro(tmp_path / "legacy.gguf", edit_meta=legacy, edit_tensors=shared64)).config
    assert (c.d_ffn_exp, c.d_ffn_shexp) == (32, 64)


@pytest.mark.parametrize("key", ["expert_count", "expert_used_count"])
def test_missing_expert_key(tmp_path, key):
    err = load_error(write_micro(tmp_path / "k.gguf", edit_meta=lambda m: m.pop(A + key)))
    assert f"missing metadata key '{A}{key}'" in err


def test_missing_expert_width_without_fallback(tmp_path):
    err = load_error(write_micro(tmp_path / "w.gguf", edit_meta=lambda m: m.pop(A + "expert_feed_forward_length")))
    assert "expert_feed_forward_length" in err and "feed_forward_length to derive it" in err


@pytest.mark.parametrize(
    "key, value, fault",
    [
        ("expert_used_count", 5, "expert_used_count 5 exceeds expert_count 4"),
        ("expert_count", 0, "is 0, must be at least 1"),
        ("expert_weights_scale", 2.5, "expert_weights_scale 2.5 is not supported"),
        ("expert_gating_func", 2, "expert_gating_func 2 is not supported"),
    ],
)
def test_nonsense_expert_value(tmp_path, key, value, fault):
    err = load_error(write_micro(tmp_path / "v.gguf", edit_meta=lambda m: m.__setitem__(A + key, value)))
    assert fault in err


def test_dense_keys_under_the_moe_arch_are_not_enough(tmp_path):
    """A dense qwen35 file relabelled qwen35moe: no experts, refused by name."""
    err = load_error(write_micro(tmp_path / "relabel.gguf", edit_meta=lambda m: m.pop(A + "expert_count")))
    assert "expert_count" in err


def test_missing_expert_stack(tmp_path):
    err = load_error(write_micro(tmp_path / "t.gguf", edit_tensors=lambda t: t.pop("blk.2.ffn_up_exps.weight")))
    assert "missing tensor 'blk.2.ffn_up_exps.weight'" in err


def test_expert_stack_with_swapped_axes(tmp_path):
    def swap(t):  # down stored like gate: [E, F, d] instead of [E, d, F]
        t["blk.0.ffn_down_exps.weight"] = np.zeros((4, 32, 64), np.float32)

    err = load_error(write_micro(tmp_path / "s.gguf", edit_tensors=swap))
    assert "tensor 'blk.0.ffn_down_exps.weight' has shape [4, 32, 64], expected [4, 64, 32]" in err


def test_wrong_architecture_names_both(tmp_path):
    err = load_error(write_micro(tmp_path / "l.gguf", arch="qwen3next"))
    assert "architecture is 'qwen3next', expected 'qwen35' or 'qwen35moe'" in err
