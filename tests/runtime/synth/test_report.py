"""The tiny synthetic model behaves like a trained one by the issue's measures."""
import pytest

from runtime.config import SHAPES
from runtime.synth.report import behaviour, compare, random_prompts, sibling_fp32

CFG = SHAPES["tiny"]


@pytest.fixture(scope="module")
def f32_run():
    W = sibling_fp32(CFG, 0, "f32")
    ids = random_prompts(CFG.vocab_size, 4, 128, seed=0)
    r, lg = behaviour(W, CFG, ids, n_sens=8)
    return r, lg, ids


def test_statistics_meet_targets(f32_run):
    r, _, _ = f32_run
    assert 3.0 <= r["logit_std"] <= 6.0
    assert r["top1_prob"] >= 0.2
    assert r["argmax_is_input"] <= 0.20
    assert r["argmax_is_previous"] <= 0.20
    assert r["offset8_sensitivity"] >= 0.10


def test_q8_0_agrees_with_f32(f32_run):
    from runtime.synth.report import batched_logits

    _, lg, ids = f32_run
    c = compare(lg, batched_logits(sibling_fp32(CFG, 0, "q8_0"), CFG, ids))
    assert c["top1"] >= 0.99 and c["kl_mean"] < 0.01


def test_prompts_avoid_special_tokens():
    ids = random_prompts(248320, 2, 300, seed=1)
    assert int(ids.max()) < 248044
