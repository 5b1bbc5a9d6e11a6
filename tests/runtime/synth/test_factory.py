"""Synthesised tiny files: deterministic, loadable by our reader and gguf's, complete metadata."""
import gguf
import pytest

from runtime.gguf import load_gguf
from runtime.synth.factory import synthesize
from runtime.synth.plan import plan
from runtime.synth.vocab import Vocab, check_vocab

# §8.2 keys llama.cpp's qwen35 loader reads.
ARCH_KEYS = [
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count", "rope.dimension_sections",
    "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
    "full_attention_interval",
]


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    return synthesize("tiny", "q8_0", 0, d / "a.gguf"), synthesize("tiny", "q8_0", 0, d / "b.gguf"), d


def test_same_seed_same_sha_other_seed_differs(tiny_q8):
    a, b, d = tiny_q8
    assert a.sha256 == b.sha256 and a.nbytes == b.nbytes
    c = synthesize("tiny", "q8_0", 1, d / "c.gguf")
    assert c.sha256 != a.sha256 and c.nbytes == a.nbytes


def test_loads_and_types_follow_the_mix(tiny_q8):
    a = tiny_q8[0]
    m = load_gguf(a.path)
    assert m.config.n_layers == 8 and m.config.vocab_size == 4096 and not m.config.tied_embeddings
    want = {t.name: t.type for t in plan(m.config, "q8_0")}
    assert {n: t.type for n, t in m.tensors.items()} == want
    assert a.nbytes == a.plan.file_nbytes()


def test_metadata_and_vocab_complete(tiny_q8):
    r = gguf.GGUFReader(tiny_q8[0].path)
    f = {k: v.contents() for k, v in r.fields.items()}
    assert f["general.architecture"] == "qwen35" and f["general.file_type"] == 7
    assert f["general.quantization_version"] == 2
    for k in ARCH_KEYS:
        assert "qwen35." + k in f, k
    assert f["qwen35.ssm.inner_size"] == 512 and f["qwen35.rope.dimension_sections"] == [11, 11, 10, 0]
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "qwen35"
    v = Vocab(f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"], f["tokenizer.ggml.merges"],
              f["tokenizer.ggml.eos_token_id"], f["tokenizer.ggml.padding_token_id"], f["tokenizer.ggml.bos_token_id"])
    assert len(v.tokens) == 4096 and check_vocab(v) == []
    assert v.tokens[v.eos_token_id] == "<|im_end|>"


def test_cuda_request_without_cuda_is_clear(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    with pytest.raises(ValueError, match="CUDA"):
        synthesize("tiny", "f32", 0, tmp_path / "x.gguf", device="cuda")
