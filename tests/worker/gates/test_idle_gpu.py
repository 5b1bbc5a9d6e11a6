"""GPU idle check (issue 14 item 3): the frozen revision's queued kernels may not run in the other's window.

A fake NVML stands in for the GPU (CI has none): a revision that queues kernels after answering
shows SM samples while frozen; the timed request is void and re-timed, and repeated occurrences name it.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from worker.config import DEFAULT_PROFILES
from worker.verdicts.faults import classify
from worker.gates.bench import GateSpec, run_sweep
from worker.gates.idle_gpu import IdleGpuCheck
from worker.harness.client import RevisionFault
from worker.records import Verdict

GATES = [GateSpec("decode@16", "decode_tok_s", 16, 4), GateSpec("prefill@16", "prefill_tok_s", 16, 16)]


class FakeGpu:
    """NVML's view: one sample per process, its latest busy period, stamped at that period's end."""

    ok, reason = True, None

    def __init__(self):
        self.busy_until: dict[int, float] = {}

    def process_utilization(self, since_s):
        now = time.time()
        return [(pid, 90, min(now, until)) for pid, until in self.busy_until.items() if min(now, until) > since_s]


class FakeProc:
    """A revision; `queue_s`: after answering it leaves that much GPU work queued (the driver's sync bypassed)."""

    def __init__(self, role, pid, gpu, queue_s=0.0, times=None):
        self.role, self.pid, self.gpu, self.queue_s, self.times = role, pid, gpu, queue_s, times
        self.track_cpu, self.last_oncpu_s, self.frozen = False, None, False

    def pin(self):
        pass

    def freeze(self, on=True):
        self.frozen = on  # stops its threads, not the GPU

    def cpu_seconds(self):
        return None

    def read_logits(self, resp, rows, phase):
        x = np.zeros((rows, 50), np.float32)
        x[:, 1] = 1.0
        return x

    def request(self, op, *, phase, timeout, **kw):
        if op == "stage":
            return {"ok": True}, 0.0
        t0 = time.time()
        self.gpu.busy_until[self.pid] = t0 + 0.004  # its own (synchronised) work inside the request
        time.sleep(0.006)
        if self.queue_s and phase == "measure" and op == "generate" and (self.times is None or self.times > 0):
            self.gpu.busy_until[self.pid] = time.time() + self.queue_s
            if self.times is not None:
                self.times -= 1
        resp = {"ok": True, "shape": [50]} if op == "prefill" else {"ok": True, "ids": [1] * kw["n"]}
        return resp, time.time() - t0


def sweep(head_queue=0.0, times=None, nv=None, settle=0.001, pairs=2, **kw):
    gpu = FakeGpu()
    procs = {"base": FakeProc("base", 101, gpu), "head": FakeProc("head", 202, gpu, head_queue, times)}
    check = IdleGpuCheck(nv or gpu, settle, pids_of=lambda p: {p.pid})
    sw = run_sweep(procs, GATES, vocab=50, model_sha="x", pairs=pairs, warmup=1, timeout=5, idle_check=check.check, **kw)
    return sw, check


def test_a_quiet_idle_revision_voids_nothing():
    sw, check = sweep()
    r = check.receipt()
    assert sw.idle_voids == [] and r["applicable"] and r["busy"] == []
    assert r["windows"] == 2 * 2 * 1 and r["covered"] == r["windows"]  # 2 reps x 1 context x 2 roles
    assert len(sw.values("base", "decode@16")) == 2


def test_kernels_left_running_while_frozen_void_the_other_timing_and_name_the_revision():
    with pytest.raises(RevisionFault) as e:
        sweep(head_queue=0.5)
    f = e.value
    assert f.role == "head" and f.kind == "idle_gpu" and "kept the GPU busy while frozen" in f.detail
    v = classify(f, "m")
    assert v.verdict is Verdict.REJECT and "kept the GPU busy while it was frozen" in v.detail  # the PR's fault
    base = classify(RevisionFault("base", "measure", "idle_gpu", f.detail), "m")
    assert base.verdict is Verdict.INFRA  # main doing it is not the PR's


def test_a_one_off_is_retimed_and_recorded():
    sw, check = sweep(head_queue=0.01, times=2, idle_retimes=8, idle_max_void=8)  # rep 1: head, then base
    assert sw.idle_voids and all(v["idle"] == "head" and v["timed"] == "base" for v in sw.idle_voids)
    assert len(sw.values("base", "decode@16")) == 2  # the voided request was timed again, none lost
    assert check.receipt()["busy"]


def test_without_per_process_samples_the_check_says_not_applicable():
    class NoNvml:
        ok, reason = False, "NVML unavailable: no driver"

    sw, check = sweep(head_queue=0.5, nv=NoNvml())
    r = check.receipt()
    assert r["applicable"] is False and "no driver" in r["reason"] and sw.idle_voids == []


def test_samples_in_another_pid_namespace_are_not_attributed():
    class Elsewhere(FakeGpu):
        def process_utilization(self, since_s):
            return [(pid + 7000, sm, ts) for pid, sm, ts in super().process_utilization(since_s)]

    gpu = Elsewhere()
    procs = {"base": FakeProc("base", 101, gpu), "head": FakeProc("head", 202, gpu, 0.5)}
    check = IdleGpuCheck(gpu, 0.001, pids_of=lambda p: {p.pid})
    run_sweep(procs, GATES, vocab=50, model_sha="x", pairs=2, warmup=0, timeout=5, idle_check=check.check)
    assert check.receipt()["applicable"] is False and "PID namespace" in check.receipt()["reason"]


def test_samples_inside_the_settle_time_do_not_count():
    """NVML's sample can carry the idle one's own previous request into the next window's start."""
    gpu = FakeGpu()
    idle, timed = FakeProc("head", 202, gpu), FakeProc("base", 101, gpu)
    check = IdleGpuCheck(gpu, 0.5, pids_of=lambda p: {p.pid})
    t0 = time.time()
    gpu.busy_until[202] = t0 + 0.2  # stamped inside the settle time
    r = check.check(timed, idle, t0, t0 + 1.0)
    assert r.applicable and not r.busy and r.covered
    gpu.busy_until[202] = time.time() + 0.6  # running well into the window: its kernels
    time.sleep(0.55)
    assert check.check(timed, idle, t0, time.time()).busy


def test_profiles_carry_the_settings():
    p = DEFAULT_PROFILES["standard"]
    assert p.idle_gpu_settle_s > 0 and p.idle_gpu_retimes >= 1 and p.idle_gpu_max_void >= 1


# -- the pipeline wires it ---------------------------------------------------------------------------
class CgroupOf:
    def __init__(self, pid):
        self.pid = pid

    def pids(self):
        return [self.pid]


def _pipeline_sweep(tmp_path, monkeypatch, device, head_queue):
    from worker import telemetry
    from worker.config import EvalSettings
    from worker.pipeline import Evaluation, Job

    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path / "cache"))
    ev = Evaluation(Job(repo=str(tmp_path), base_ref="main", head_ref="pr"), EvalSettings(),
                    trusted_root=tmp_path / "trusted", workdir=tmp_path / "work")
    ev.profile = ev.profile.model_copy(update={"device": device, "pairs": 2, "warmup": 0, "inner": 1, "clock": "wall",
                                               "idle_gpu_settle_s": 0.001})
    gpu = FakeGpu()
    monkeypatch.setattr(telemetry, "nvml", lambda index=0: gpu)
    procs = {"base": FakeProc("base", 101, gpu), "head": FakeProc("head", 202, gpu, head_queue)}
    for p in procs.values():  # the parent reads a revision's PIDs from its cgroup
        p.cgroup, p.proc = CgroupOf(p.pid), None
    return ev._sweep(procs, GATES, 50, "x", "s", ev.profile.models[0])


def test_the_gpu_pipeline_runs_the_check(tmp_path, monkeypatch):
    sw = _pipeline_sweep(tmp_path, monkeypatch, "cuda", 0.0)
    assert sw.idle_gpu["applicable"] is True and sw.idle_gpu["windows"] == 4 and sw.idle_gpu["voided"] == []
    with pytest.raises(RevisionFault) as e:
        _pipeline_sweep(tmp_path, monkeypatch, "cuda", 0.5)
    assert e.value.role == "head" and e.value.kind == "idle_gpu"


def test_a_cpu_evaluation_says_not_applicable(tmp_path, monkeypatch):
    sw = _pipeline_sweep(tmp_path, monkeypatch, "cpu", 0.5)
    assert sw.idle_gpu == {"applicable": False, "reason": "CPU evaluation: no GPU kernels to be in flight"}


def test_the_settle_time_covers_nvmls_sampling_period():
    """On a GPU that samples every 0.6 s a sample 0.5 s into the window can still be the idle one's own."""
    gpu = FakeGpu()
    gpu.utilization_period_s = lambda: 0.6
    idle, timed = FakeProc("head", 202, gpu), FakeProc("base", 101, gpu)
    check = IdleGpuCheck(gpu, 0.2, pids_of=lambda p: {p.pid})
    t0 = time.time() - 2.0
    gpu.busy_until[202] = t0 + 0.5
    assert not check.check(timed, idle, t0, t0 + 2.0).busy
    assert check.receipt()["settle_s"] == pytest.approx(0.9) and check.receipt()["nvml_period_s"] == 0.6
    gpu.busy_until[202] = t0 + 1.0
    assert check.check(timed, idle, t0, t0 + 2.0).busy
