"""Issue 13 end to end on the CPU profile with fake runtimes: mixed PRs, KL drift, main failing its own
bars, the sentinel A/A pair, self-calibration that resumes, the result cache key."""
import pytest

from worker.calibration.aa_store import AAStore
from worker.calibration.auto import calibrate_pairs
from worker.queue.tasks import idempotency_key
from worker.records import InfraKind, Verdict

from tests.worker.helpers import GOOD, fake_model, make_profile, make_repo, make_settings
from tests.worker.helpers import LOOSE, eval_fakes, reference_verify_stages


@pytest.mark.sandbox
def test_decode_speedup_with_prefill_regression_is_mixed_not_a_tier(tmp_path, cache, monkeypatch):
    staged = reference_verify_stages(monkeypatch)
    r = eval_fakes(tmp_path, base="slow_decode", head="slow_prefill", decode_contexts=[32], prefill_contexts=[256],
              pairs=4, inner=2, settings=LOOSE, calibrate=True)
    assert r.verdict is Verdict.MIXED, r.summary
    assert {g.gate for g in r.gates if g.regression} == {"prefill@256"}
    assert any(g.gate == "decode@32" and g.significant and g.rel_change > 0 for g in r.gates)
    assert r.best_speedup is None
    # a gate is faster: its outputs are verified whatever else regressed (a skipped check could hide the work
    # the speedup skipped; only a model slower on some gate and faster on none goes unverified)
    assert staged and "outputs_partly_verified" not in r.receipt["models"]["fake"], staged
    assert any("/" in k.split(":")[1] for k in staged), staged  # the confirming pairs' outputs too


@pytest.mark.sandbox
def test_kl_drift_with_every_argmax_unchanged_is_rejected(tmp_path, cache):
    r = eval_fakes(tmp_path, head="kl_drift")
    assert r.verdict is Verdict.REJECT, r.summary
    (g,) = r.guards
    assert g.paired_delta == 0 and g.head_top1 == g.base_top1 and g.head_kl > g.kl_bound
    assert "base's" in g.reason and "accuracy guard failed" in r.summary


@pytest.mark.sandbox
def test_a_fix_of_a_broken_main_that_costs_speed_is_not_blamed_on_the_pr(tmp_path, cache):
    """Main emits a wrong token in 3; the PR fixes that at twice the decode work. Slower on a gate and faster on none,
    its outputs are checked on the first pair's verified rep only, and that still holds base to its own bars:
    INFRA (main fails them), never the PR's REJECT (red-team finding on the skipped output checks)."""
    r = eval_fakes(tmp_path, base="broken_generate", head="slow_decode", decode_contexts=[32], prefill_contexts=[],
                   pairs=3, verify_reps=1)
    assert r.verdict is Verdict.INFRA and r.infra_kind is InfraKind.BASELINE_CRASHED, r.summary
    assert "baseline's outputs agree with the reference on only" in r.summary


@pytest.mark.sandbox
def test_main_failing_its_own_bars_is_infra(tmp_path, cache):
    store = AAStore(tmp_path / "aa.sqlite")
    good = eval_fakes(tmp_path / "a", settings=LOOSE, calibrate=True, store=store)  # guard A/A of a good main
    # only the guards are this step's business: its speed gates run at LOOSE's 5 % false-significance
    # rate on a shared CI core, so their verdict is a coin with a known bias (CI once drew REJECT here)
    assert good.guards and all(g.passed for g in good.guards), good.summary
    assert good.verdict is not Verdict.INFRA, good.summary
    r = eval_fakes(tmp_path / "b", base="wrong", head="wrong", store=store)  # main changed under us; head = main
    assert r.verdict is Verdict.INFRA and r.infra_kind is InfraKind.BASELINE_FAILED_GUARD, r.summary


def _pair_deltas(store: AAStore) -> int:
    import sqlite3

    (n,), = sqlite3.connect(store.path).execute("SELECT COUNT(*) FROM pair_delta").fetchall()
    return n


@pytest.mark.sandbox
def test_sentinel_pair_is_recorded_every_evaluation(tmp_path, cache):
    store = AAStore(tmp_path / "aa.sqlite")
    r = eval_fakes(tmp_path, settings={"sentinel_aa_pair": "always"}, store=store)
    assert r.receipt["models"]["fake"]["sentinel_aa_pair"]["recorded"] is None  # owed by the verdict...
    assert r.receipt["upkeep"]["fake"]["recorded"], r.receipt["upkeep"]  # ...and taken before evaluate() returns
    assert _pair_deltas(store) == 2  # one A/A delta per gate
    off = eval_fakes(tmp_path / "off", settings={"sentinel_aa_pair": "never"})
    assert "sentinel_aa_pair" not in off.receipt["models"]["fake"] and "upkeep" not in off.receipt


@pytest.mark.sandbox
def test_the_verdict_does_not_wait_for_the_sentinel_pair(tmp_path, cache):
    """Evaluation.run() returns the verdict with the pair owed; upkeep() takes it, on a fresh checkout of the
    base in a folder of its own (the evaluation's is gone, or a retry's by then), and leaves no folder behind."""
    store = AAStore(tmp_path / "aa.sqlite")
    ev = _sentinel_evaluation(tmp_path, store)
    r = ev.run()
    assert r.verdict not in (Verdict.INFRA, Verdict.REJECT), r.summary
    assert _pair_deltas(store) == 0 and "sentinel" not in [x["phase"] for x in r.receipt["phases"]]
    retry = ev.workdir / "attempt-2"  # an INFRA retry reuses the evaluation id, so its folder, on another card
    retry.mkdir(parents=True)
    report = ev.upkeep()
    assert report["fake"]["recorded"] is True and _pair_deltas(store) == 2, report
    assert retry.exists() and not list(retry.parent.parent.glob(f"{retry.parent.name}-upkeep-*"))
    assert ev.upkeep() == {}  # owed once, taken once


def _sentinel_evaluation(tmp_path, store: AAStore):
    from worker.pipeline import Evaluation, Job

    repo = make_repo(tmp_path)
    p = make_profile(fake_model(tmp_path / "m.gguf"), pairs=2, inner=1, warmup=0, prompts_per_seed=1)
    p = p.model_copy(update={"models": [p.models[0].model_copy(update={"decode_contexts": [32],
                                                                       "prefill_contexts": [64]})]})
    return Evaluation(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"),
                      make_settings(p, sentinel_aa_pair="always"), trusted_root=GOOD, store=store)


@pytest.mark.sandbox
def test_an_infra_verdict_owes_no_sentinel_pair(tmp_path, cache, monkeypatch):
    """A box that failed a check (here: the verdict came back INFRA after the gates ran) is not the null's: the
    pair its evaluation owed is dropped, not recorded into the history the floors come from."""
    from worker.verdicts import attribution

    store = AAStore(tmp_path / "aa.sqlite")
    ev = _sentinel_evaluation(tmp_path, store)
    confirm = attribution.confirm_head_fault
    monkeypatch.setattr(attribution, "confirm_head_fault", lambda first, again, on: _as_infra(confirm(first, again, on)))
    assert ev.run().verdict is Verdict.INFRA
    assert "INFRA" in ev.upkeep()["dropped"] and _pair_deltas(store) == 0


def _as_infra(r):
    r.verdict, r.infra_kind = Verdict.INFRA, InfraKind.FOREIGN_GPU_PROCESS
    return r


@pytest.mark.sandbox
def test_a_foreign_gpu_process_during_the_sentinel_pair_records_nothing(tmp_path, cache, monkeypatch):
    from worker.pipeline import Evaluation
    from worker.verdicts.faults import infra

    store = AAStore(tmp_path / "aa.sqlite")
    ev = _sentinel_evaluation(tmp_path, store)
    assert ev.run().verdict not in (Verdict.INFRA, Verdict.REJECT)
    check = Evaluation._foreign_gpu_check

    def foreign_after_the_pair(self, procs, when):
        if when == "after the A/A sentinel pair":
            raise infra(InfraKind.FOREIGN_GPU_PROCESS, f"{when}: foreign process(es) [4242] on the GPU")
        return check(self, procs, when)

    monkeypatch.setattr(Evaluation, "_foreign_gpu_check", foreign_after_the_pair)
    report = ev.upkeep()
    assert report["fake"]["recorded"] is False and "4242" in report["fake"]["reason"] and _pair_deltas(store) == 0


@pytest.mark.sandbox
def test_self_calibration_records_pairs_and_resumes(tmp_path, cache):
    repo = make_repo(tmp_path)
    p = make_profile(fake_model(tmp_path / "m.gguf"), pairs=2, inner=1, warmup=0, prompts_per_seed=1)
    p = p.model_copy(update={"models": [p.models[0].model_copy(update={"decode_contexts": [32],
                                                                       "prefill_contexts": [64]})]})
    s = make_settings(p, false_significance_rate=0.05)  # the fewest pairs that reach it: 5
    store = AAStore(tmp_path / "aa.sqlite")
    part = calibrate_pairs(str(repo), "main", s, store=store, trusted_root=GOOD, budget_s=0.0)
    assert not part.done and part.pairs_recorded == 1 and "run again" in part.stopped
    split = part.per_pair_phases[0]["guard_seconds"]  # the first pair scores the guards' A/A: where it went
    assert set(split) == {"base", "head"} and split["base"]["logits"] > 0 and split["base"]["reference"] >= 0
    rest = calibrate_pairs(str(repo), "main", s, store=store, trusted_root=GOOD)
    assert rest.done and rest.pairs_recorded == 4 and all(v == 5 for v in rest.after.values()), rest
    # each pair says whether the idle-GPU check looked (on the CPU it cannot, and says why)
    idle = [ph["idle_gpu"] for ph in rest.per_pair_phases]
    assert len(idle) == 4 and all(i["applicable"] is False and "CPU" in i["reason"] for i in idle), idle
    assert rest.per_pair_phases[-1]["guard_seconds"] is None  # enough guard A/A by then: no scoring
    again = calibrate_pairs(str(repo), "main", s, store=store, trusted_root=GOOD)
    assert again.done and again.pairs_recorded == 0


def test_result_cache_key_includes_base_and_head():
    job = {"repo_full_name": "o/r", "pr_number": 1, "head_sha": "h1", "base_sha": "b1", "profile": "standard"}
    assert idempotency_key(job) != idempotency_key({**job, "base_sha": "b2"})
    assert idempotency_key(job) != idempotency_key({**job, "head_sha": "h2"})
