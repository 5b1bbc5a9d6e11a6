"""The verdict rules (worker/verdicts/rules.py) and fault attribution (worker/verdicts/attribution.py), on plain records."""
import pytest

from worker.verdicts.attribution import block_after_failed_attempts, confirm_head_fault
from worker.config import EvalSettings
from worker.records import EvalResult, GateResult, Verdict
from worker.records import GuardResult
from worker.verdicts.rules import decide, settled


def gate(name, change, *, sig=True, scored=True, lo=None, hi=None):
    lo = change - 0.01 if lo is None else lo
    hi = change + 0.01 if hi is None else hi
    return GateResult(model="m", gate=name, metric="decode_tok_s", base_median=100, head_median=100 * (1 + change),
                      rel_change=change, ci_low=lo, ci_high=hi, noise_floor=0.004, significant=sig,
                      regression=sig and change < 0, scored=scored, n_pairs=3)


S = EvalSettings()


def test_a_regression_is_never_hidden_by_a_speedup():
    gates = [gate("decode@128", 0.20), gate("prefill@512", -0.09, scored=False)]
    d = decide(gates, [], [], {}, S)
    assert d.verdict is Verdict.MIXED and "prefill@512" in d.summary and "decode@128" in d.summary
    assert d.best_speedup is None
    r = decide(gates, [], [], {}, S.model_copy(update={"regression_policy": "reject"}))
    assert r.verdict is Verdict.REJECT and "prefill@512" in r.summary
    assert decide([gate("prefill@512", -0.09)], [], [], {}, S).verdict is Verdict.REJECT


def _guard(passed):
    return GuardResult("m", [0], 0.9, 0.95, 1e-3, 1e-4, 0.9, -0.05, 0.01, 5e-4, False, passed, None if passed else "x")


def test_only_a_verdict_that_nothing_can_change_stops_the_measuring():
    """Measuring stops once the verdict is REJECT whatever comes next: a failed guard or check at once; a regression
    only under the "reject" policy, since under "mixed" a speedup still to be measured makes it MIXED."""
    reject = S.model_copy(update={"regression_policy": "reject"})
    assert settled([_guard(True)], [], [], S) is None and settled([_guard(True)], [], [], reject) is None
    assert "m accuracy guard failed" in settled([_guard(False)], [], [], S)
    assert settled([], ["m decode@128: head's outputs agree on 50 %"], [], S).startswith("m decode@128")
    assert settled([], [], ["m decode@128"], S) is None  # mixed (the default): the other models may be faster
    assert settled([], [], ["m decode@128"], reject) == "regression on m decode@128"
    # what `settled` calls settled, `decide` decides so: REJECT
    g = [gate("decode@128", -0.09)]
    assert decide(g, [], [], {}, reject).verdict is Verdict.REJECT
    assert decide([gate("decode@128", 0.3)], [_guard(False)], [], {}, S).verdict is Verdict.REJECT


def test_tier_comes_from_the_conservative_end_of_the_interval():
    d = decide([gate("decode@128", 0.06, lo=0.03, hi=0.09)], [], [], {}, S)
    assert d.verdict is Verdict.S and d.best_speedup == pytest.approx(0.03)  # the point estimate would give M
    assert decide([gate("decode@128", 0.03, lo=0.01, hi=0.05)], [], [], {}, S).verdict is Verdict.NONE
    best = decide([gate("decode@128", 0.30, lo=0.06), gate("decode@512", 0.20, lo=0.16)], [], [], {}, S)
    assert best.verdict is Verdict.L and best.best_speedup == pytest.approx(0.16)


def test_uncalibrated_is_said_plainly_never_none_all_guards_pass():
    d = decide([gate("decode@128", 0.0, sig=False)], [], [], {"m decode@128": "0 A/A pairs"}, S)
    assert d.verdict is Verdict.UNCALIBRATED and "no tier, no pass, never merged" in d.summary
    assert "all guards pass" not in d.summary and "0 A/A pairs" in d.summary
    # even a big measured speedup earns nothing until calibrated
    assert decide([gate("decode@128", 0.5)], [], [], {"m decode@128": "x"}, S).verdict is Verdict.UNCALIBRATED
    # a regression beyond the uncalibrated floor in every pair is still a REJECT, said to have no bound
    r = decide([gate("decode@128", -0.5)], [], [], {"m decode@128": "x"}, S)
    assert r.verdict is Verdict.REJECT and "no bound" in r.summary


def _res(verdict, failure=None, **kw):
    return EvalResult(repo="r", pr_number=1, base_sha="b", head_sha="h", profile="p", verdict=verdict,
                      summary="s", failure=failure, **kw)


F = {"role": "head", "model": "m", "phase": "load", "kind": "error", "detail": "IndexError", "what": "raised"}


def test_head_fault_is_confirmed_by_one_retry_then_rejected():
    calls = []
    r = confirm_head_fault(_res(Verdict.REJECT, F), lambda: calls.append(1) or _res(Verdict.REJECT, F))
    assert calls == [1] and r.verdict is Verdict.REJECT and r.failure["attempts"] == 2
    assert "both attempts" in r.summary and "load" in r.summary


def test_a_head_that_fails_once_cannot_earn_a_tier():
    r = confirm_head_fault(_res(Verdict.REJECT, F), lambda: _res(Verdict.M, best_speedup=0.06))
    assert r.verdict is Verdict.WITHHELD and "attempt 1" in r.summary
    assert confirm_head_fault(_res(Verdict.REJECT, F), lambda: _res(Verdict.INFRA)).verdict is Verdict.INFRA


def test_an_earlier_infra_attempt_blocks_a_tier():
    assert block_after_failed_attempts(_res(Verdict.L), attempt=2).verdict is Verdict.WITHHELD
    assert block_after_failed_attempts(_res(Verdict.L), attempt=1).verdict is Verdict.L
    assert block_after_failed_attempts(_res(Verdict.REJECT), attempt=3).verdict is Verdict.REJECT


def test_no_new_verdict_can_be_merged_or_look_green():
    from bot.enums import check_conclusion
    from bot.rounds import WINNING
    from bot.github.labels import labels_for

    for v in (Verdict.MIXED, Verdict.UNCALIBRATED, Verdict.WITHHELD):
        assert v.value not in WINNING
        assert check_conclusion(v).value != "success"
    mixed = _res(Verdict.MIXED, gates=[gate("decode@128", 0.2), gate("prefill@512", -0.09)])
    labels = labels_for(mixed, S)
    assert "eval:mixed" in labels and "regression-m-prefill@512" in labels
    assert not any(l.startswith("eval-m:") and l.split(":")[1] in ("S", "M", "L", "XL") for l in labels)


def test_head_oom_is_judged_by_base_measured_memory_not_the_message():
    from worker.verdicts.faults import classify
    from worker.harness.client import RevisionFault

    f = RevisionFault("head", "load", "oom", "MemoryError")
    fits = classify(f, "m", {"base_peak_bytes": 1 << 30, "limit_bytes": 16 << 30})
    assert fits.verdict is Verdict.REJECT and fits.failure["kind"] == "oom" and "1024 MiB" in fits.detail
    tight = classify(f, "m", {"base_peak_bytes": 15 << 30, "limit_bytes": 16 << 30})
    assert tight.verdict is Verdict.INFRA  # main itself nearly fills the box: not the PR's fault
    assert classify(f, "m", None).verdict is Verdict.INFRA  # nothing measured: no blame
    assert classify(RevisionFault("base", "load", "oom", "x"), "m").verdict is Verdict.INFRA
    assert classify(RevisionFault("head", "measure", "sandbox", "x"), "m").verdict is Verdict.INFRA
    assert classify(RevisionFault("head", "measure", "error", "CUDA error: illegal address"), "m").failure


@pytest.mark.parametrize("kind", ["error", "crashed", "timeout", "load", "nonfinite", "protocol", "import"])
def test_a_baseline_fault_of_any_kind_is_infra_never_the_prs(kind):
    from worker.harness.client import RevisionFault
    from worker.records import InfraKind
    from worker.verdicts.faults import classify

    f = classify(RevisionFault("base", "measure", kind, "segfault in a kernel"), "m")
    assert f.verdict is Verdict.INFRA and f.infra_kind is InfraKind.BASELINE_CRASHED and f.failure is None, f
    assert classify(RevisionFault("head", "measure", kind, "segfault in a kernel"), "m").verdict is not Verdict.INFRA
