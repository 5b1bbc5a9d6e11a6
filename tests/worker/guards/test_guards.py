"""Accuracy guards paired against base: KL drift with top-1 unchanged fails; main failing its own
bars is INFRA; a bit-identical head cannot fail; prompts look like text."""
import numpy as np
import pytest

from worker.config import EvalSettings
from worker.verdicts.faults import EvalFault
from worker.guards.scoring import RevisionScores, SeedScore, guard_bounds, guard_result, text_like_ids
from worker.records import InfraKind, Verdict

S = EvalSettings()


def scores(role, top1, kl, identical=False):
    r = RevisionScores(role, [SeedScore(i, top1, kl, kl * 3) for i in range(3)])
    if role == "head":
        r.identical_to["base"] = identical
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
    """Bars so tight that a head with base's very scores fails them unless it is bit for bit base's."""
    b = guard_bounds(AA, 3, S)
    tight = b.__class__(**{**b.__dict__, "kl_ratio": 0.5, "kl_tol": 0.0})
    twin = {"base": scores("base", 0.99, 1.0e-4), "head": scores("head", 0.99, 1.0e-4, identical=True)}
    g = guard_result("m", twin, tight)
    assert g.passed and g.bit_identical
    other = {"base": scores("base", 0.99, 1.0e-4), "head": scores("head", 0.99, 1.0e-4, identical=False)}
    assert not guard_result("m", other, tight).passed


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


class _Proc:
    """Stands in for a revision process: records the staged prompt ids, answers logits from a fixed
    projection (so the path through score_revisions is the real one)."""

    def __init__(self, tmp, vocab, role):
        self.scratch, self.vocab, self.role, self.staged = tmp, vocab, role, []
        tmp.mkdir(parents=True, exist_ok=True)

    def request(self, op, **kw):
        if op == "stage":
            self.staged.append(kw["ids"])
            return {}, 0.0
        ids = np.asarray(self.staged[-1])
        self._last = np.sin(np.outer(ids + 1, np.arange(self.vocab)) * 0.01).astype(np.float32)
        return {"shape": [len(ids), self.vocab]}, 0.0

    def read_logits(self, resp, rows, phase):  # the real one reads the parent's shared memory
        assert resp["shape"] == [rows, self.vocab]
        return self._last


def test_guard_prompts_sent_to_the_revisions_look_like_text(tmp_path, cache):
    from worker.config import DEFAULT_PROFILES
    from worker.guards.scoring import score_revisions

    vocab = 4096
    prof = DEFAULT_PROFILES["quick"].model_copy(update={"prompt_len": 512, "long_context": 2048})
    procs = {r: _Proc(tmp_path / r, vocab, r) for r in ("base", "head")}
    ref = _Proc(tmp_path / "ref", vocab, "reference")
    sc = score_revisions(procs, ref, vocab=vocab, model_sha="0" * 64, ref_version="v", profile=prof)
    staged = procs["head"].staged
    assert max(len(x) for x in staged) == 2048 and sc["head"].long_context == 2048  # one long context
    ids = np.concatenate([np.asarray(x) for x in staged])
    counts = np.sort(np.bincount(ids, minlength=vocab))[::-1]
    assert counts[0] > 20 * len(ids) / vocab  # a Zipf head, not uniform ids
    assert ids.max() < vocab - 26  # no special tokens


class _Changed(_Proc):
    """A head whose logits differ from base's in one value of its `at`-th logits answer only."""

    def __init__(self, tmp, vocab, role, at, change):
        super().__init__(tmp, vocab, role)
        self.answers, self.at, self.change = 0, at, change

    def request(self, op, **kw):
        resp = super().request(op, **kw)
        if op != "stage":
            self.answers += 1
            if self.answers == self.at:
                self._last = self._last.copy()
                self.change(self._last)
        return resp


def _score(tmp_path, head):
    from worker.config import DEFAULT_PROFILES
    from worker.guards.scoring import score_revisions

    prof = DEFAULT_PROFILES["quick"].model_copy(update={"prompt_len": 64, "long_context": 256})
    procs = {"base": _Proc(tmp_path / "base", 512, "base"), "head": head}
    return score_revisions(procs, _Proc(tmp_path / "ref", 512, "reference"), vocab=512, model_sha="0" * 64,
                           ref_version="v", profile=prof)


def _one_ulp(a):
    a[3, 5] = np.nextafter(a[3, 5], np.float32(np.inf))


def _negative_zero(a):
    assert a[0, 0] == 0.0  # sin(0): column 0 is exactly zero
    a[0, 0] = -0.0  # equal as a value, not as bits


@pytest.mark.parametrize("change", [_one_ulp, _negative_zero])
def test_bit_identity_is_exact_on_every_prompt(tmp_path, cache, change):
    same = _score(tmp_path / "same", _Proc(tmp_path / "same" / "head", 512, "head"))
    assert same["head"].identical_to == {"base": True} and same["base"].identical_to == {}
    # its 7th answer: the last prompt of the last seed (after 2 prompts + the long one of seed 0, then 2 + 2)
    changed = _score(tmp_path / "changed", _Changed(tmp_path / "changed" / "head", 512, "head", at=7, change=change))
    assert changed["head"].identical_to == {"base": False}
