"""Real changes in the engine's code: a 2x slower decode, a 2x faster one, a subtly wrong kernel."""
import pytest

from worker.records import Verdict

from tests.worker.helpers import LOOSE, eval_fakes, fake_model, make_profile, reference_verify_stages

TIERS = (Verdict.S, Verdict.M, Verdict.L, Verdict.XL)


@pytest.mark.sandbox
def test_real_slowdown_is_rejected_naming_the_gate(tmp_path, cache, monkeypatch):
    staged = reference_verify_stages(monkeypatch)
    r = eval_fakes(tmp_path, head="slow_decode", decode_contexts=[32, 160], prefill_contexts=[64], pairs=4, inner=2,
                   verify_reps=1)
    assert r.verdict == Verdict.REJECT, r.summary
    reg = {g.gate for g in r.gates if g.regression}
    assert reg and reg <= {"decode@32", "decode@160"}, r.summary  # prefill is untouched by the change
    assert any(g in r.summary for g in reg)
    for g in r.gates:
        if g.regression:
            assert g.rel_change < -0.15 and g.ci_high < 0
    # slower on a gate, faster on none: no output can turn that into a pass, so the reference checks only the first
    # pair's verified rep (base's own bars, the head's gross errors), no confirming pair and no other rep (on the
    # 9B each pair's full check is ~2 minutes of the fp32 reference), and the verdict's notes say so
    assert r.receipt["models"]["fake"]["process_pairs"] > 1
    pair = lambda k: k.split(":")[1]  # noqa: E731 - the sweep id: the evaluation's, "/pairN" for a confirming pair
    assert staged and all("/" not in pair(k) for k in staged), staged
    assert len({k.split(":")[2] for k in staged}) == 1, staged  # one rep, timed prefills included
    assert "first process pair's verified rep only" in r.receipt["models"]["fake"]["outputs_partly_verified"]
    assert any("verified rep only" in n for n in r.notes), r.notes


@pytest.mark.sandbox
def test_confirming_pairs_of_a_slowdown_time_the_shortest_context_and_the_furthest_gate(tmp_path, cache, monkeypatch):
    """Every gate 2x slower, none faster: no pass or tier is at stake, so the confirming pairs time two contexts at
    most (the shortest, and the gate furthest beyond its floor: worker/gates/confirm.py); the REJECT names what it
    confirmed and the notes what it did not."""
    from worker.harness.client import RevisionProcess

    confirming, request = set(), RevisionProcess.request

    def spy(self, op, **k):  # the contexts each confirming pair's head is staged for
        if op == "stage" and self.role == "head" and "/pair" in k["key"]:
            confirming.add(int(k["key"].split(":")[0].removeprefix("ctx")))
        return request(self, op, **k)

    monkeypatch.setattr(RevisionProcess, "request", spy)
    r = eval_fakes(tmp_path, head="slow_all", decode_contexts=[32, 96, 160], prefill_contexts=[64], pairs=2)
    assert r.verdict == Verdict.REJECT, r.summary
    assert 32 in confirming and len(confirming) <= 2, confirming
    dropped = r.receipt["models"]["fake"]["gates_not_confirmed"]
    contexts = {g.gate: int(g.gate.split("@")[1]) for g in r.gates}
    assert set(dropped) == {g for g, c in contexts.items() if c not in confirming}, dropped
    assert all(g.not_confirmed and not g.regression for g in r.gates if g.gate in dropped)  # short of the design
    assert any(g.regression and g.gate in r.summary for g in r.gates if g.gate not in dropped), r.summary
    assert any("not confirmed" in n and all(g in n for g in dropped) for n in r.notes), r.notes


@pytest.mark.sandbox
def test_a_decoy_gate_cannot_steer_a_real_regression_out_of_the_confirmation(tmp_path, cache, monkeypatch):
    """The head is really 2x slower at decode@160 and, only in a process that ran a long context first, 6x at
    decode@96: the decoy is the shortest gate in play and the furthest beyond its floor, so the confirming pairs time
    it alone first, and there it is not slow. The gates left out are then timed after all: REJECT on decode@160,
    as the full design gives (a red-team finding). Only the two slower gates: the narrowing needs every gate in
    play slower, and an unchanged noisy gate (a fake prefill@64 at stop 40's CI) could come out faster by chance
    and keep it from running; the spy checks that it ran."""
    from collections import defaultdict

    from worker.harness.client import RevisionProcess

    timed, request = defaultdict(set), RevisionProcess.request

    def spy(self, op, **k):  # the contexts each confirming pair's head is staged for, by pair
        if op == "stage" and self.role == "head" and "/pair" in k["key"]:
            ctx, sweep = k["key"].split(":")[:2]
            timed[int(sweep.rsplit("/pair", 1)[1])].add(int(ctx.removeprefix("ctx")))
        return request(self, op, **k)

    monkeypatch.setattr(RevisionProcess, "request", spy)
    r = eval_fakes(tmp_path, head="decoy", decode_contexts=[96, 160], prefill_contexts=[], pairs=4, warmup=1)
    assert r.verdict == Verdict.REJECT and "decode@160" in {g.gate for g in r.gates if g.regression}, r.summary
    assert "decode@160" not in r.receipt["models"]["fake"].get("gates_not_confirmed", {})
    assert timed[1] == {96} and any(160 in c for n, c in timed.items() if n > 1), dict(timed)  # narrowed, then back


@pytest.mark.sandbox
def test_a_decoy_on_one_model_beside_a_speedup_on_another_is_mixed_not_a_tier(tmp_path, cache):
    from worker.config import ModelSpec

    a = ModelSpec(name="fakeA", path=str(fake_model(tmp_path / "a.gguf", 0)), decode_contexts=[32, 96, 160],
                  prefill_contexts=[64])
    b = ModelSpec(name="fakeB", path=str(fake_model(tmp_path / "b.gguf", 1)), decode_contexts=[32],
                  prefill_contexts=[64])
    r = eval_fakes(tmp_path, head="decoy", base="slow_decode_model_b", models=[a, b], pairs=4, warmup=1,
                   calibrate=True, settings=LOOSE)
    assert r.verdict == Verdict.MIXED, r.summary
    assert "fakeA decode@160" in {f"{g.model} {g.gate}" for g in r.gates if g.regression}, r.summary


@pytest.mark.sandbox
def test_real_speedup_gets_a_tier(tmp_path, cache, monkeypatch):
    from worker.harness.client import RevisionProcess

    events, request = [], RevisionProcess.request

    def spy(self, op, **k):  # the timed sweeps' staging and the reference's checks, in order
        if op == "stage" and (self.role == "head" or k.get("phase") == "verify"):
            events.append((self.role, k["key"].split(":")[1]))
        return request(self, op, **k)

    monkeypatch.setattr(RevisionProcess, "request", spy)
    # decode only: a noisy fake prefill gate, slower by chance in the first pair at LOOSE's rate (about half the
    # runs), would rightly defer the checks below (tests/worker/verdicts/test_trust.py has the mixed case)
    r = eval_fakes(tmp_path, base="slow_decode", head="good", decode_contexts=[32], prefill_contexts=[], pairs=4,
                   inner=2, settings=LOOSE, calibrate=True)
    assert r.verdict in TIERS and "decode@32" in r.summary, r.summary
    (g,) = r.gates
    assert g.significant and g.ci_low > 0.25 and g.n_pairs >= 2
    assert r.best_speedup == g.ci_low < g.rel_change  # the tier: the conservative end, not the point estimate
    # no gate could end slower: each pair is checked before the next is timed, so the worker never holds more than
    # one pair's per-step logits (on the 9B ~0.6 GB a pair)
    first = [pair for role, pair in events if role == "head" and "/" not in pair][-1]  # the PR's (calibration's before)
    first_check = events.index(("reference", first))
    first_confirm = events.index(("head", f"{first}/pair1"))
    assert first_check < first_confirm, events


@pytest.mark.sandbox
def test_subtly_wrong_kernel_fails_the_guard_and_nothing_is_timed_after_it(tmp_path, cache, monkeypatch):
    from worker.harness.client import RevisionProcess

    timed, request = [], RevisionProcess.request

    def spy(self, op, **k):
        if k.get("phase") in ("warmup", "measure"):
            timed.append((self.role, op))
        return request(self, op, **k)

    monkeypatch.setattr(RevisionProcess, "request", spy)
    spec = make_profile(fake_model(tmp_path / "m.gguf")).models[0].model_copy(
        update={"decode_contexts": [32], "prefill_contexts": [64]})
    r = eval_fakes(tmp_path, head="wrong", models=[spec, spec.model_copy(update={"name": "fake2"})])
    assert r.verdict == Verdict.REJECT, r.summary
    (g,) = r.guards
    assert not g.passed and g.paired_delta < 0 and not g.bit_identical
    assert "accuracy guard failed" in r.summary
    # accuracy first: a failed guard is REJECT whatever follows, so no gate is timed and no later model loaded
    assert timed == [] and r.gates == [], timed
    assert "speed gates not measured" in r.receipt["models"]["fake"]["gates_not_measured"]
    assert "fake accuracy guard failed" in r.receipt["models_not_measured"]["fake2"]
    assert any(n.startswith("fake2: not measured") for n in r.notes), r.notes
