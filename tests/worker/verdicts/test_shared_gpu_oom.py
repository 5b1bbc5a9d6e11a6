"""On a GPU the head, base and the trusted reference share one card's memory: a head that holds more than base
ever needed, when the reference (or base) runs out, is the PR's fault, not INFRA. Otherwise INFRA says what
each process held, the worker's own included (a 9B evaluation on an 80 GB card: the reference OOM'd in verify
beside ~17 GB of the worker's own scoring cache, bench/receipts/gpu-e2e-h100-20261206T172010Z.json)."""
import os
import shutil

import pytest

from worker import telemetry
from worker.calibration.aa_store import AAStore
from worker.harness.client import RevisionFault
from worker.pipeline import Evaluation, Job, evaluate
from worker.records import InfraKind, Verdict
from worker.verdicts.faults import classify, shared_oom_is_heads

from tests.worker.helpers import GOOD, fake_model, make_profile, make_repo, make_settings, overlay
from tests.worker.verdicts.test_foreign_gpu import StubNvml

GIB = 1 << 30


def _memory(head, base_peak=10 * GIB, **held):
    return {"base_peak_bytes": base_peak, "limit_bytes": 80 * GIB, "head_bound": 1.1, "slack_bytes": 256 << 20,
            "gpu_held": {"worker": 1 * GIB, "base": 10 * GIB, "head": head, "reference": 37 * GIB, **held}}


@pytest.mark.parametrize("role", ["reference", "base"])
def test_an_oom_beside_a_head_holding_more_than_base_needed_is_the_prs(role):
    f = classify(RevisionFault(role, "verify", "oom", "CUDA out of memory"), "m", _memory(head=30 * GIB))
    assert f.verdict is Verdict.REJECT and f.failure["role"] == "head" and f.failure["kind"] == "oom"
    assert "30.0 GiB" in f.detail and "10.0 GiB" in f.detail and role in f.detail


@pytest.mark.parametrize("role", ["reference", "base"])
def test_an_oom_beside_a_head_like_base_is_infra_and_says_who_held_what(role):
    f = classify(RevisionFault(role, "verify", "oom", "CUDA out of memory"), "m", _memory(head=10.5 * GIB))
    assert f.verdict is Verdict.INFRA and f.infra_kind is InfraKind.OOM and f.failure is None
    assert "worker 1.0 GiB" in f.detail and "reference 37.0 GiB" in f.detail and "of 80.0 GiB" in f.detail
    # nothing measured (a CPU evaluation: each process has its own cgroup): no blame either way
    assert classify(RevisionFault(role, "verify", "oom", "x"), "m", None).verdict is Verdict.INFRA
    assert classify(RevisionFault(role, "verify", "oom", "x"), "m", {"base_peak_bytes": GIB}).verdict is Verdict.INFRA


def test_a_fresh_pairs_oom_counts_every_process_running_the_prs_code():
    """A confirmation pair's base runs out beside the first pair: a head that kept its model after `unload` holds
    twice what base needed across its two processes."""
    kept = _memory(head=10 * GIB, **{"pair-base": 10 * GIB, "pair-head": 10 * GIB})
    f = classify(RevisionFault("base", "load", "oom", "CUDA out of memory"), "m", kept)
    assert f.verdict is Verdict.REJECT and "20.0 GiB" in f.detail
    dropped = _memory(head=GIB // 2, **{"pair-base": 10 * GIB, "pair-head": 10 * GIB})
    assert classify(RevisionFault("base", "load", "oom", "x"), "m", dropped).verdict is Verdict.INFRA


def test_the_bound_is_the_memory_gates():
    edge = 10 * GIB * 1.1 + (256 << 20)
    assert not shared_oom_is_heads(_memory(head=int(edge)))[0]
    assert shared_oom_is_heads(_memory(head=int(edge) + 1))[0]


@pytest.mark.sandbox
@pytest.mark.timed
@pytest.mark.parametrize("head_gib,verdict", [(40, Verdict.REJECT), (10, Verdict.INFRA)])
def test_an_evaluation_attributes_the_references_oom_by_what_the_head_held(tmp_path, cache, monkeypatch, head_gib,
                                                                            verdict):
    """The trusted reference runs out of memory at load (the `oom` fake as the trusted root); NVML (a stub: no GPU
    on CI) says what each process holds. A head holding 4x base's memory is rejected after its confirming
    attempt; a head like base leaves the fault INFRA."""
    trusted = tmp_path / "trusted"
    shutil.copytree(GOOD, trusted, ignore=shutil.ignore_patterns("__pycache__"))
    overlay(trusted, "oom")
    class Nvml(StubNvml):  # this worker's own process holds 2 GiB (its scoring runs on the same card)
        def process_memory(self, pids):
            return 2 * GIB if pids == {os.getpid()} else None

    monkeypatch.setattr(telemetry, "nvml", lambda index=0: Nvml([]))
    held = {"base": 10 * GIB, "head": head_gib * GIB, "reference": 30 * GIB}
    monkeypatch.setattr(Evaluation, "_gpu_bytes", lambda self, proc: held[proc.role] if proc.proc else None)
    repo = make_repo(tmp_path)
    p = make_profile(fake_model(tmp_path / "m.gguf"), device="cuda", memory_limit_bytes=None, pairs=2, inner=1,
                     warmup=0, prompts_per_seed=1)
    r = evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"), make_settings(p),
                 trusted_root=trusted, store=AAStore(tmp_path / "aa.sqlite"))
    assert r.verdict is verdict, r.summary
    if verdict is Verdict.REJECT:
        assert r.failure["attempts"] == 2 and "held GPU memory the reference needed" in r.summary
    else:
        assert r.infra_kind is InfraKind.OOM and "head 10.0 GiB" in r.infra_detail, r.infra_detail
        assert "worker 2.0 GiB" in r.infra_detail and r.receipt["worker_peak_gpu_memory_bytes"] == 2 * GIB
