"""A/A calibration feeds the noise floors and guard bounds; INFRA is retried with backoff."""
import socket

import pytest

from worker.calibration.aa_store import AAStore
from worker.cli import calibrate
from worker.config import EvalSettings
from worker.guards.scoring import guard_bounds
from worker.pipeline import Job, evaluate, evaluate_with_retries
from worker.records import InfraKind, Verdict

from tests.worker.helpers import GOOD, fake_model, make_profile, make_repo, make_settings


def _profile(tmp_path):
    p = make_profile(fake_model(tmp_path / "m.gguf"), pairs=3, inner=1, warmup=0, prompts_per_seed=1)
    return p.model_copy(update={"models": [p.models[0].model_copy(update={"decode_contexts": [32],
                                                                          "prefill_contexts": [64]})]})


@pytest.mark.sandbox
def test_calibrate_records_deltas_and_the_next_evaluation_uses_them(tmp_path, cache):
    repo = make_repo(tmp_path)
    store = AAStore(tmp_path / "aa.sqlite")
    # A loose rate, so 5 A/A runs suffice: 2 gates → 2.5e-2 per gate → 3 agreeing pairs (6/(6·7·8)).
    settings = make_settings(_profile(tmp_path), min_aa_samples=5, false_significance_rate=0.05)
    summary = calibrate(str(repo), "main", settings, runs=5, store=store, trusted_root=GOOD)
    assert summary["runs"] == 5
    floors = summary["floors"]
    assert set(floors) == {"fake decode@32", "fake prefill@64"}
    # n = 5 → the design: every one of 4 pairs beyond the most extreme A/A delta (1/C(9,4) per side)
    assert all(f["n"] == 5 and f["floor"] > 0 and f["pairs"] == 4 for f in floors.values()), floors
    assert all(f["bound"] <= 0.025 for f in floors.values())
    assert "cpu/" in summary["host"] and socket.gethostname() not in summary["host"]  # not keyed by hostname
    rows = store.guard_aa(_only_guard_key(store), "test")
    assert len(rows) == 5 * 3  # 5 runs x 3 seeds, both roles
    r = evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"), settings,
                 trusted_root=GOOD, store=store)
    nf = r.receipt["models"]["fake"]["noise_floors"]
    assert nf["decode@32"]["calibrated"] and nf["decode@32"]["floor"] == floors["fake decode@32"]["floor"]
    assert nf["decode@32"]["pairs"] == floors["fake decode@32"]["pairs"] and len(nf["decode@32"]["pair_deltas"]) >= 1
    (g,) = [g for g in r.gates if g.gate == "decode@32"]  # both one-sided floors reach the comment
    assert (g.floor_slower, g.floor_faster) == (nf["decode@32"]["floor_slower"], nf["decode@32"]["floor_faster"])
    assert 0 < g.floor_slower <= g.noise_floor and 0 < g.floor_faster <= g.noise_floor
    assert r.receipt["models"]["fake"]["guard_bounds"]["calibrated"]
    # The default rate (1e-3) is out of reach of 5 runs: said so, with the fixed floor and every pair.
    strict = evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"),
                      make_settings(_profile(tmp_path)), trusted_root=GOOD, store=store)
    nf = strict.receipt["models"]["fake"]["noise_floors"]["decode@32"]
    assert not nf["calibrated"] and nf["bound"] is None and "`tokengate calibrate`" in nf["reason"]


def _only_guard_key(store):
    import sqlite3

    (k,), = sqlite3.connect(store.path).execute("SELECT DISTINCT guard_key FROM guard_aa").fetchall()
    return k


def test_guard_bounds_from_aa_scores():
    s = EvalSettings()
    # main's per-seed top-1 wanders between 0.887 and 0.925 (the seeds' bar-inside-noise case)
    scores = [(i, t, 0.05) for i, t in enumerate([0.887, 0.925, 0.91, 0.9, 0.915, 0.905])]
    b = guard_bounds(scores, n_seeds=3, s=s)
    assert b.calibrated and b.top1_floor <= 0.887  # main itself never fails its own floor
    assert b.max_drop >= s.top1_max_drop_min and b.kl_bound >= 0.05
    u = guard_bounds(scores[:2], n_seeds=3, s=s)
    assert not u.calibrated and u.top1_floor == s.top1_floor_default


@pytest.mark.sandbox
def test_infra_is_retried_with_backoff_then_said_plainly(tmp_path, cache):
    repo = make_repo(tmp_path, base="load_fail")  # the baseline's fault: INFRA (a head fault is the PR's)
    settings = make_settings(_profile(tmp_path)).model_copy(update={"retries": 2, "retry_backoff_s": 1.5})
    slept = []
    r = evaluate_with_retries(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"), settings,
                              sleep=slept.append, trusted_root=GOOD, store=AAStore(tmp_path / "aa.sqlite"))
    assert r.verdict == Verdict.INFRA and r.infra_kind == InfraKind.BASELINE_CRASHED
    assert slept == [1.5, 3.0] and r.attempt == 3
    assert "still failing after 3 attempts" in r.summary and "nothing was merged" in r.summary


@pytest.mark.sandbox
def test_checkout_of_a_missing_ref_is_infra(tmp_path, cache):
    repo = make_repo(tmp_path)
    r = evaluate(Job(repo=str(repo), base_ref="main", head_ref="no-such-branch", profile="test"),
                 make_settings(_profile(tmp_path)), trusted_root=GOOD, store=AAStore(tmp_path / "aa.sqlite"))
    assert r.verdict == Verdict.INFRA and r.infra_kind == InfraKind.CHECKOUT_FAILURE
    assert "no-such-branch" in r.infra_detail


@pytest.mark.sandbox
def test_whole_evaluation_time_limit_is_infra(tmp_path, cache):
    repo = make_repo(tmp_path)
    p = _profile(tmp_path).model_copy(update={"eval_timeout_s": 0.01})
    r = evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"), make_settings(p),
                 trusted_root=GOOD, store=AAStore(tmp_path / "aa.sqlite"))
    assert r.verdict == Verdict.INFRA and r.infra_kind == InfraKind.TIMEOUT, r.summary
    assert "limit" in r.infra_detail


@pytest.mark.sandbox
def test_a_guard_failing_by_chance_in_an_aa_run_stops_no_model_from_recording(tmp_path, cache, monkeypatch):
    """A PR's evaluation stops measuring once its verdict is settled (a failed guard); an A/A calibration run never
    does: each model's draw is taken whatever an earlier model showed (red-team finding on the early stop)."""
    import sqlite3
    from dataclasses import replace

    import worker.pipeline as pipeline

    real = pipeline.guard_result
    monkeypatch.setattr(pipeline, "guard_result", lambda model, *a: replace(real(model, *a), passed=model != "fake",
                                                                             reason="forced"))
    p = _profile(tmp_path)
    p = p.model_copy(update={"models": [p.models[0], p.models[0].model_copy(update={"name": "fake2"})]})
    store = AAStore(tmp_path / "aa.sqlite")
    calibrate(str(make_repo(tmp_path)), "main", make_settings(p), runs=1, store=store, trusted_root=GOOD)
    models = {m for (m,) in sqlite3.connect(store.path).execute("SELECT DISTINCT model FROM pair_delta")}
    assert models == {"fake", "fake2"}
