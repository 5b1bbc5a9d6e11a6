"""The first process pair drops its model once its sweep is verified, before any fresh pair loads one.

On a GPU the fresh pairs (confirmation, the A/A sentinel) load beside the first pair and the trusted reference;
the 9B's five processes do not fit an 80 GB card (the reference alone held 39.5 GiB in verify,
bench/receipts/gpu-e2e-h100-20261206T172010Z.json)."""
from __future__ import annotations

import pytest

from worker.calibration.aa_store import AAStore
from worker.config import ModelSpec
from worker.harness.client import RevisionFault, RevisionProcess
from worker.records import Verdict

from tests.worker.helpers import eval_fakes, fake_model, loaded_fake


@pytest.mark.sandbox
@pytest.mark.timed
def test_the_driver_drops_its_model_on_unload(tmp_path):
    with loaded_fake(tmp_path, "base") as proc:
        assert "error" not in proc.request("memory", phase="measure", timeout=10)[0]["memory"]
        assert proc.request("unload", phase="measure", timeout=10)[0]["ok"]
        assert "error" in proc.request("memory", phase="measure", timeout=10)[0]["memory"]  # no engine left
        proc.request("stage", key="k", ids=[1, 2, 3], phase="measure", timeout=10)
        with pytest.raises(RevisionFault):
            proc.request("prefill", key="k", phase="measure", timeout=10)


@pytest.mark.sandbox
@pytest.mark.timed
def test_the_first_pair_unloads_before_the_sentinel_pair_starts(tmp_path, cache, monkeypatch):
    events = []
    start, request = RevisionProcess.start, RevisionProcess.request

    def spy_start(self, *a, **k):
        events.append(("start", self.role))
        return start(self, *a, **k)

    def spy_request(self, op, **k):
        if op == "unload":
            events.append(("unload", self.role))
        return request(self, op, **k)

    monkeypatch.setattr(RevisionProcess, "start", spy_start)
    monkeypatch.setattr(RevisionProcess, "request", spy_request)
    r = eval_fakes(tmp_path, settings={"sentinel_aa_pair": "always"}, store=AAStore(tmp_path / "aa.sqlite"))
    assert r.receipt["upkeep"]["fake"]["recorded"], (r.summary, events)
    # base, head and the reference start first (the last such start: an INFRA retry on a busy box starts over)
    main = max(i for i, e in enumerate(events) if e == ("start", "reference"))
    fresh = next(i for i, e in enumerate(events) if i > main and e[0] == "start")  # the sentinel's base-vs-base pair
    assert {e for e in events[main:fresh] if e[0] == "unload"} == {("unload", "base"), ("unload", "head")}, events
    # what the revisions said about their memory was asked for before they let it go
    assert all(v is not None for v in r.receipt["models"]["fake"]["memory_reported_by_revision"].values())
    # the sentinel pair's load and sweep are the upkeep's phase, after the verdict: in neither "verify" nor its time
    assert "sentinel" not in [p["phase"] for p in r.receipt["phases"]], r.receipt["phases"]
    assert [p["phase"] for p in r.receipt["upkeep"]["phases"]] == ["sentinel"], r.receipt["upkeep"]


@pytest.mark.sandbox
@pytest.mark.timed
def test_the_first_pair_is_frozen_while_a_confirming_pair_is_timed(tmp_path, cache, monkeypatch):
    """The first pair's processes live on (the next model loads in them): while a fresh pair is timed they must not
    run. Otherwise the first head could load the GPU exactly while the fresh base is timed, signalled by the fresh
    head through the compile cache both heads share (one SHA, one cache): a slower base, a tier for the PR."""
    from worker.gates.noise import GateNull
    from worker.pipeline import Evaluation

    states, sweep = [], Evaluation._sweep

    def spy(self, procs, *a, **k):
        main = self._main_procs
        if procs["head"] is not main["head"]:  # a fresh (confirming) pair
            states.append({r: main[r].cgroup.frozen() for r in ("base", "head")})
        return sweep(self, procs, *a, **k)

    monkeypatch.setattr(Evaluation, "_sweep", spy)
    monkeypatch.setattr(GateNull, "wants_more", lambda self, deltas: len(deltas) < 2)  # one confirming pair
    m = ModelSpec(name="fake", path=str(fake_model(tmp_path / "m.gguf")), decode_contexts=[32], prefill_contexts=[64])
    two = [m, m.model_copy(update={"name": "fake-guard", "role": "guard"})]  # the second loads in the thawed pair
    r = eval_fakes(tmp_path, models=two, request_timeout_s=10, settings={"sentinel_aa_pair": "never"})
    assert r.verdict not in (Verdict.INFRA, Verdict.BUILD_FAILED), r.summary
    pairs = [r.receipt["models"][n]["process_pairs"] for n in ("fake", "fake-guard")]
    # at least one confirming pair each (a gate left out of a narrowed one is timed in another: gates/confirm.py)
    assert all(n >= 2 for n in pairs), (pairs, r.summary)
    assert states == [{"base": True, "head": True}] * sum(n - 1 for n in pairs), states
