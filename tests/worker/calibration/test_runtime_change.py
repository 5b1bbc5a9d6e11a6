"""After main's runtime changed, a gate's floor is checked against fresh A/A pairs of it before use:
kept (pooled) when the noise is the same, rebuilt when it is larger or smaller."""
import sqlite3
import time

import numpy as np
import pytest

from worker.calibration.aa_store import AAStore
from worker.calibration.auto import base_runtime, calibrate_pairs, calibrated
from worker.calibration.history import current_null
from worker.config import EvalSettings
from worker.pipeline import Evaluation, Job

from tests.worker.helpers import GOOD, fake_model, git, make_profile, make_repo, make_settings

S = EvalSettings()
ARGS = ("k", "quick", "proto", "m", "decode@128")
OLD, NEW = "a" * 40, "b" * 40


def _fill(store, deltas, start, runtime):
    for i, d in enumerate(deltas):
        store.add_pair_delta_at(*ARGS, d, created=start + i, runtime=runtime)


def _null(store, runtime, now):
    return current_null(store, *ARGS, S, per_gate_rate=1e-3, max_pairs=4, now=now, runtime=runtime)


def _history(tmp_path, sd_new, n_new, seed=0):
    """30 A/A pairs of runtime OLD (sd 3 %, as the H200's 0.8B prefill@4096 before prefill graphs), then
    `n_new` of runtime NEW at `sd_new`."""
    store = AAStore(tmp_path / "aa.sqlite")
    rng = np.random.default_rng(seed)
    now = time.time()
    _fill(store, list(rng.normal(0, 0.03, 30)), now - 5000, OLD)
    _fill(store, list(rng.normal(0, sd_new, n_new)), now - 1000, NEW)
    return store, now


def test_a_changed_runtime_is_uncalibrated_until_its_pairs_are_recorded(tmp_path):
    store, now = _history(tmp_path, 0.03, S.drift_window - 1)
    n = _null(store, NEW, now)
    assert not n.calibrated and n.state == "drift"
    assert "runtime changed" in n.reason and f"{S.drift_window - 1} of {S.drift_window}" in n.reason


def test_a_late_event_on_the_older_base_reads_its_own_lineage(tmp_path):
    """Evaluations of the older main (late events) neither wait for a check nor undo the newer one's."""
    store, now = _history(tmp_path, 0.003, S.drift_window)
    old = _null(store, OLD, now)
    assert old.calibrated and old.aa_deltas == 30  # its own rows: it came first
    assert _null(store, NEW, now).aa_deltas == S.drift_window and _null(store, OLD, now).aa_deltas == 30


def test_a_quieter_runtime_rebuilds_the_floor(tmp_path):
    """Prefill CUDA graphs took a 3 % pair sd to 0.3 %: the old floor would hide 1-2 % slowdowns."""
    store, now = _history(tmp_path, 0.003, S.drift_window)
    n = _null(store, NEW, now)
    assert not n.calibrated and n.aa_deltas == S.drift_window  # only the new runtime's pairs count
    assert n.state == "drift" and "runtime changed" in n.reason and "its own A/A pairs" in n.reason
    _fill(store, list(np.random.default_rng(9).normal(0, 0.003, 20)), now - 500, NEW)  # the rebuild
    rebuilt = _null(store, NEW, now)
    assert rebuilt.calibrated and rebuilt.aa_deltas == 20 + S.drift_window
    assert -np.expm1(rebuilt.lo) < 0.02  # a floor from the new noise, not the old 3 %


def test_a_noisier_runtime_rebuilds_the_floor(tmp_path):
    store, now = _history(tmp_path, 0.3, S.drift_window)
    n = _null(store, NEW, now)
    assert not n.calibrated and n.aa_deltas == S.drift_window


def test_the_same_noise_keeps_and_pools_the_history(tmp_path):
    store, now = _history(tmp_path, 0.03, S.drift_window, seed=3)
    n = _null(store, NEW, now)
    assert n.calibrated and n.aa_deltas == 30 + S.drift_window
    assert _null(store, NEW, now).aa_deltas == 30 + S.drift_window  # the same pairs, the same answer


def test_rows_of_unknown_runtime_never_start_a_check(tmp_path):
    store = AAStore(tmp_path / "aa.sqlite")
    _fill(store, list(np.random.default_rng(4).normal(0, 0.003, 40)), time.time() - 5000, None)
    assert _null(store, NEW, time.time()).calibrated


def test_a_file_from_before_runtimes_were_kept_gains_the_column(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE pair_delta (host TEXT NOT NULL, profile TEXT NOT NULL, protocol TEXT NOT NULL, "
               "model TEXT NOT NULL, gate TEXT NOT NULL, delta REAL NOT NULL, sha TEXT, created REAL NOT NULL)")
    db.execute("INSERT INTO pair_delta VALUES ('k','quick','proto','m','decode@128',0.01,NULL,1.0)")
    db.commit()
    db.close()
    store = AAStore(path)
    store.add_pair_delta(*ARGS, 0.02, runtime=NEW)
    assert [r for _, _, r in store.runtime_rows(*ARGS)] == [NEW, None]


@pytest.mark.sandbox
def test_the_worker_records_the_new_runtimes_pairs_before_evaluating(tmp_path, cache):
    repo = make_repo(tmp_path)
    p = make_profile(fake_model(tmp_path / "m.gguf"), pairs=2, inner=1, warmup=0, prompts_per_seed=1)
    p = p.model_copy(update={"models": [p.models[0].model_copy(update={"decode_contexts": [32],
                                                                       "prefill_contexts": []})]})
    s = make_settings(p, false_significance_rate=0.05, drift_window=3)  # 4 pairs calibrate one gate, 3 check
    store = AAStore(tmp_path / "aa.sqlite")
    first = calibrate_pairs(str(repo), "main", s, store=store, trusted_root=GOOD)
    assert first.done and first.pairs_recorded == first.target["fake decode@32"] == 4 and first.runtime_check == {}

    def ev():
        return Evaluation(Job(repo=str(repo), base_ref="main", head_ref="main", profile=s.profile), s, store=store,
                          trusted_root=GOOD)

    (repo / "NOTES.md").write_text("not the runtime\n")  # a change outside runtime/: nothing to check
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "docs")
    assert calibrated(ev(), base_runtime(ev()))
    (repo / "runtime" / "merged.py").write_text("# a merge to main's runtime\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "runtime change")
    new = base_runtime(ev())
    assert new == git(repo, "rev-parse", "main:runtime") and not calibrated(ev(), new)
    check = calibrate_pairs(str(repo), "main", s, store=store, trusted_root=GOOD)
    assert check.done and check.pairs_recorded == 3 and check.runtime_check == {"fake decode@32": 3}, check
    assert calibrated(ev(), new)
    rows = store.runtime_rows(first.key, s.profile, ev().protocol_key("fake"), "fake", "decode@32")
    assert [r for _, _, r in rows[:3]] == [new] * 3 and new not in [r for _, _, r in rows[3:]]
    assert calibrate_pairs(str(repo), "main", s, store=store, trusted_root=GOOD).pairs_recorded == 0


@pytest.mark.sandbox
def test_pairs_of_only_some_models_leave_the_others_untouched(tmp_path, cache):
    """A bench's placebo gives the quick guard model its pairs in one piece (`only`): the other model is not loaded
    and gets no pair, and every pair recorded is the chosen model's."""
    from worker.config import ModelSpec

    repo = make_repo(tmp_path)
    p = make_profile(fake_model(tmp_path / "m.gguf"), pairs=2, inner=1, warmup=0, prompts_per_seed=1)
    guard = ModelSpec(name="guard", role="guard", path=str(fake_model(tmp_path / "g.gguf", seed=1)),
                      decode_contexts=[32], prefill_contexts=[])
    p = p.model_copy(update={"models": [p.models[0].model_copy(update={"decode_contexts": [32],
                                                                       "prefill_contexts": []}), guard]})
    s = make_settings(p, false_significance_rate=0.05)
    store = AAStore(tmp_path / "aa.sqlite")
    run = calibrate_pairs(str(repo), "main", s, store=store, trusted_root=GOOD, only={"guard"})
    assert run.pairs_recorded == run.after["guard decode@32"] >= 1 and run.after["fake decode@32"] == 0, run
    assert not run.done  # the model left out is not calibrated
