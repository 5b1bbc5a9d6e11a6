"""Accuracy guards paired against base: KL drift with top-1 unchanged fails; main failing its own
bars is INFRA; a bit-identical head cannot fail; prompts look like text."""
import hashlib

import numpy as np
import pytest

from worker.config import EvalSettings
from worker.faults import EvalFault
from worker.guards import RevisionScores, SeedScore, guard_bounds, guard_result, text_like_ids
from worker.records import InfraKind, Verdict

S = EvalSettings()


def scores(role, top1, kl, digest=b""):
    r = RevisionScores(role, [SeedScore(i, top1, kl, kl * 3) for i in range(3)])
    r.logits_digest = hashlib.sha256(digest or f"{role}{top1}{kl}".encode())
    return r


AA = [(i % 3, 0.99, 1.0e-4, 0.99, 1.0e-4) for i in range(9)]  # A/A: main's KL 1e-4, head/base ratio 1


def test_kl_multiplied_with_top1_unchanged_is_rejected():
    b = guard_bounds(AA, 3, S)
    g = guard_result("m", {"base": scores("base", 0.99, 1.0e-4), "head": scores("head", 0.99, 6.6e-4)}, b)
    assert not g.passed and "6.6x base" in g.reason and g.paired_delta == 0
    assert g.kl_bound <= 1.5 * 1.0e-4 + S.kl_abs_tol  # the bar shown is the one applied
    # uncalibrated too (the absolute default is 0.5: only the pairing sees it)
    u = guard_bounds([], 3, S)
    assert not guard_result("m", {"base": scores("base", 0.99, 1e-4), "head": scores("head", 0.99, 6.6e-4)}, u).passed
    # a small honest change passes
    assert guard_result("m", {"base": scores("base", 0.99, 1.0e-4), "head": scores("head", 0.99, 1.1e-4)}, b).passed


def test_aa_ratio_spread_widens_the_ratio_bound():
    noisy = [(i % 3, 0.99, 1e-4, 0.99, 1e-4 * r) for i, r in enumerate([0.7, 1.4, 0.8, 1.3, 1.0, 0.75, 1.35])]
    assert guard_bounds(noisy, 3, S).kl_ratio > S.kl_ratio_max


def test_main_failing_its_own_bars_is_infra_not_reject():
    b = guard_bounds(AA, 3, S)
    with pytest.raises(EvalFault) as e:
        guard_result("m", {"base": scores("base", 0.90, 1e-4), "head": scores("head", 0.99, 1e-4)}, b)
    assert e.value.verdict is Verdict.INFRA and e.value.infra_kind is InfraKind.BASELINE_FAILED_GUARD
    assert "the reference, driver or model changed" in e.value.detail


def test_bit_identical_head_cannot_fail():
    b = guard_bounds(AA, 3, S).__class__(**{**guard_bounds(AA, 3, S).__dict__, "kl_bound": 2e-4})
    same = dict(digest=b"same logits")
    g = guard_result("m", {"base": scores("base", 0.99, 1.9e-4, **same), "head": scores("head", 0.99, 1.9e-4, **same)},
                     b.__class__(**{**b.__dict__, "kl_ratio": 1.0001, "kl_tol": 0.0, "max_drop": 0.0}))
    assert g.passed and g.bit_identical


def test_prompts_have_text_statistics_not_uniform_ids():
    vocab = 248320
    ids = np.array(text_like_ids(vocab, 4096, "accuracy", 0, 0))
    assert ids.max() < 248044  # normal tokens only: no specials, no padding
    counts = np.bincount(ids)
    top = np.sort(counts)[::-1]
    assert top[0] > 40 * 4096 / vocab * 10  # a Zipf head: the commonest token far above uniform
    assert len(np.unique(ids)) < 0.8 * len(ids)  # words repeat
    ngrams = {tuple(ids[i:i + 4]) for i in range(len(ids) - 4)}
    assert len(ngrams) < len(ids) - 4 - 50  # repeated spans (what long contexts need)
    assert text_like_ids(vocab, 64, "a") == text_like_ids(vocab, 64, "a") != text_like_ids(vocab, 64, "b")
