"""The MoE synthetic factory: the 35B-A3B plan, deterministic tiny-moe bytes, and a router that
behaves like a trained one (some experts hot, the choice still token-dependent)."""
from dataclasses import replace
from math import prod

import pytest
import torch

from runtime.config import shape
from runtime.gguf import load_gguf
from runtime.gguf.names import expected_tensors
from runtime.gguf.types import GGMLType
from runtime.models.qwen35_reference import Qwen35Reference
from runtime.synth import init as I
from runtime.synth.factory import synthesize
from runtime.synth.plan import plan

TINY = shape("tiny-moe")


def test_35b_a3b_plan_sizes_and_types():
    cfg = shape("35b-a3b")
    p = {t.name: t for t in plan(cfg, "q4_k_m")}
    total = sum(prod(t.shape) for t in p.values())
    experts = sum(prod(t.shape) for n, t in p.items() if n.endswith("_exps.weight"))
    active = total - experts + experts * cfg.n_expert_used // cfg.n_expert
    assert 34e9 < total < 36e9 and 3e9 < active < 4e9  # "35B-A3B"
    assert p["blk.0.ffn_gate_exps.weight"].shape == (256, 512, 2048)
    assert p["blk.0.ffn_down_exps.weight"].shape == (256, 2048, 512)
    assert p["blk.7.ffn_gate_inp.weight"].type == GGMLType.F32  # router never quantized
    assert p["blk.7.ffn_gate_inp_shexp.weight"].type == GGMLType.F32
    assert p["blk.7.ffn_up_exps.weight"].type == GGMLType.Q4_K
    # ffn_down of the routed and the shared expert take llama.cpp's use_more_bits layers (0..4, 7, 10, ..., 35..39)
    assert [i for i in range(40) if p[f"blk.{i}.ffn_down_exps.weight"].type == GGMLType.Q6_K] == \
        [i for i in range(40) if p[f"blk.{i}.ffn_down_shexp.weight"].type == GGMLType.Q6_K] == \
        [0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 35, 36, 37, 38, 39]
    assert p["blk.0.ffn_down_exps.weight"].nbytes == 256 * 2048 * 2 * 210  # Q6_K rows of 512
    assert 20e9 < sum(t.nbytes for t in p.values()) < 22.5e9


def test_2b_dense_plan():
    cfg = shape("2b")
    assert (cfg.n_layers, cfg.d_model, cfg.d_ffn, cfg.tied_embeddings) == (24, 2048, 6144, True)
    total = sum(prod(t.shape) for t in plan(cfg, "q4_k_m"))
    assert 1.8e9 < total < 2.4e9


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    return synthesize("tiny-moe", "q4_k_m", 0, d / "a.gguf", workers=1), synthesize(
        "tiny-moe", "q4_k_m", 0, d / "b.gguf", workers=2), d


def test_tiny_moe_bytes_are_deterministic_whatever_the_workers(tiny_q4):
    a, b, d = tiny_q4
    assert a.sha256 == b.sha256 and a.nbytes == b.nbytes == a.plan.file_nbytes()
    c = synthesize("tiny-moe", "q4_k_m", 1, d / "c.gguf", workers=2)
    assert c.sha256 != a.sha256 and c.nbytes == a.nbytes


def test_tiny_moe_loads_as_qwen35moe_with_the_planned_types(tiny_q4):
    m = load_gguf(tiny_q4[0].path)
    assert m.config.arch == "qwen35moe" and m.metadata["general.architecture"] == "qwen35moe"
    assert replace(m.config, name=TINY.name, rms_eps=TINY.rms_eps) == TINY
    assert {n: t.type for n, t in m.tensors.items()} == {t.name: t.type for t in plan(TINY, "q4_k_m")}
    assert m["blk.1.ffn_up_exps.weight"].type == GGMLType.Q4_K and m["blk.1.ffn_up_exps.weight"].shape == (16, 256, 256)


def test_expert_chunks_are_whole_experts_and_seeded_apart():
    cfg = shape("35b-a3b")
    s = (256, 512, 2048)
    assert I.chunk_count("blk.3.ffn_up_exps.weight", s) == 256 // I.experts_per_chunk(s) > 1
    a = I.generate_chunk("blk.3.ffn_up_exps.weight", s, cfg, 0, I.DEFAULT, 0)
    b = I.generate_chunk("blk.3.ffn_up_exps.weight", s, cfg, 0, I.DEFAULT, 1)
    assert a.shape == (I.experts_per_chunk(s), 512, 2048) and not torch.equal(a[0], b[0])


# -- routing statistics -----------------------------------------------------------------------------


def _weights(spec, seed=0):
    return {n: torch.cat(list(I.generate(n, s, TINY, seed, spec))) for n, s in expected_tensors(TINY).items()}


def routing_skew(spec, seed=0, n_tokens=96):
    """Per MoE layer: (chi²/df of the expert loads against uniform, share of the top quarter, experts used)."""
    ref = Qwen35Reference(TINY, _weights(spec, seed))
    ref.routes = []
    ids = torch.randint(0, TINY.vocab_size, (n_tokens,), generator=torch.Generator().manual_seed(seed))
    ref.forward(ids, ref.new_state(), all_logits=True)
    out = []
    for r in ref.routes:
        c = torch.bincount(r.flatten(), minlength=TINY.n_expert).float()
        chi = float(((c - c.mean()) ** 2 / c.mean()).sum()) / (TINY.n_expert - 1)
        top = float(c.sort(descending=True).values[: TINY.n_expert // 4].sum() / c.sum())
        out.append((chi, top, int((c > 0).sum()), len({tuple(sorted(x)) for x in r.tolist()})))
    return out


def test_router_has_hot_experts_but_stays_token_dependent():
    stats = routing_skew(I.DEFAULT)
    assert len(stats) == TINY.n_layers
    chi = sum(s[0] for s in stats) / len(stats)
    top = sum(s[1] for s in stats) / len(stats)
    # uniform top-k routing gives chi²/df ≈ 1 and a top-quarter share ≈ 0.3 at this prompt length;
    # measured here: chi²/df 9.9, share 0.46 (seed 0)
    assert chi > 6 and top > 0.42, stats
    for _, share, used, distinct in stats:
        assert share < 0.8 and used >= 12 and distinct >= 40, stats  # not collapsed onto a few experts


def test_the_skew_metric_fails_a_router_without_popularity():
    """The statistic above is not met by construction: with no per-expert popularity it falls short."""
    stats = routing_skew(replace(I.DEFAULT, router_hot=0.0))
    assert sum(s[0] for s in stats) / len(stats) < 6, stats
