"""The initialisation: per-tensor determinism, structure, sane gates."""
import torch

from runtime.config import SHAPES
from runtime.gguf.names import expected_tensors
from runtime.synth import init as I

CFG = SHAPES["tiny"]


def _full(name, seed=0):
    return torch.cat([c.reshape(-1, *c.shape[1:]) for c in I.generate(name, expected_tensors(CFG)[name], CFG, seed)])


def test_tensor_depends_only_on_seed_and_name():
    a = _full("blk.5.ffn_up.weight")
    _full("blk.1.attn_qkv.weight")  # generating others in between changes nothing
    assert torch.equal(a, _full("blk.5.ffn_up.weight"))
    assert not torch.equal(a, _full("blk.5.ffn_up.weight", seed=1))
    assert not torch.equal(a, _full("blk.6.ffn_up.weight"))


def test_embedding_successor_structure():
    e = _full("token_embd.weight")
    perm = I.coord_perm(CFG, I.DEFAULT)
    t = torch.arange(0, 4096, 37)
    assert torch.equal(e[I.successor(t, I.DEFAULT.orbit)], e[t][:, perm])
    assert torch.all(e[:, I.BIAS] == I.DEFAULT.bias_value)


def test_embedding_chunks_equal_one_piece():
    cfg = SHAPES["0.8b"]
    step = I.rows_per_chunk((cfg.vocab_size, cfg.d_model), I.DEFAULT.orbit)
    whole = I.embedding_rows(cfg, 3, I.DEFAULT, step, 2 * step)
    first = next(iter(I.generate("token_embd.weight", (cfg.vocab_size, cfg.d_model), cfg, 3)))
    assert first.shape == (step, cfg.d_model) and not torch.equal(first, whole)
    assert torch.equal(whole[:, I.coord_perm(cfg, I.DEFAULT)][:-1][:: I.DEFAULT.orbit],
                       whole[1 :: I.DEFAULT.orbit])


def test_decays_and_gates_are_valid():
    for i in CFG.deltanet_layers:
        a = _full(f"blk.{i}.ssm_a")
        assert torch.all(a < 0), i  # GGUF stores -exp(A_log)
        assert torch.all(torch.isfinite(_full(f"blk.{i}.ssm_dt.bias")))
    assert torch.all(_full("output_norm.weight") > 0)
