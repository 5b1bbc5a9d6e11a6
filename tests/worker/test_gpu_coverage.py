"""Issue 19: GPU profiles at the seed bot's coverage, per-SHA compile caches, memory gates, phase times."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from worker import compile_cache, sandbox
from worker.guards import arith
from worker.checkout import Revision
from worker.config import MERGEABLE_PROFILES, EvalSettings
from worker.gates.bench import GateSpec, Sweep, run_sweep
from worker.guards.scoring import _log_softmax
from worker.harness.client import RevisionFault
from worker.gates.judge import ModelOutcome, judge_memory
from worker.pipeline import Evaluation, Job
from worker.queue import tasks


def test_standard_is_the_seed_bots_coverage():
    s = EvalSettings()
    std = s.profile_settings("standard")
    primary = next(m for m in std.models if m.role == "primary")
    guards = [m for m in std.models if m.role == "guard"]
    assert std.device == "cuda"
    assert primary.synth["shape"] == "9b" and primary.synth["quant"] == "q4_k_m"
    assert primary.decode_contexts == [128, 512, 4096, 16384, 32768]
    assert primary.prefill_contexts == [4096, 32768]
    # A guard of another shape AND another quant type, with gates of its own.
    assert any(g.synth["shape"] != "9b" and g.synth["quant"] != "q4_k_m" and g.gate_names() for g in guards)
    full = s.profile_settings("full")
    fp = next(m for m in full.models if m.role == "primary")
    assert {65536, 131072} <= set(fp.prefill_contexts) and 65536 in fp.decode_contexts
    assert set(primary.gate_names()) <= set(fp.gate_names())
    assert s.profile_settings("quick").device == "cpu" and s.profile == "quick"  # demo / CI default
    assert "quick" not in MERGEABLE_PROFILES and {"standard", "full"} <= MERGEABLE_PROFILES


@pytest.mark.parametrize("device, expected", [("cuda", "standard"), ("cuda:1", "standard"), (None, "quick"),
                                              ("cpu", "quick")])
def test_a_gpu_worker_defaults_to_standard(monkeypatch, device, expected):
    if device is None:
        monkeypatch.delenv("TOKENGATE_DEVICE", raising=False)
    else:
        monkeypatch.setenv("TOKENGATE_DEVICE", device)
    assert tasks.default_profile(EvalSettings()) == expected


# -- compile caches per revision SHA -------------------------------------------------------------
def _evaluation(tmp_path, monkeypatch, base_sha="a" * 40, head_sha="b" * 40):
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path / "cache"))
    ev = Evaluation(Job(repo=str(tmp_path), base_ref="main", head_ref="pr"), EvalSettings(),
                    trusted_root=tmp_path / "trusted", workdir=tmp_path / "work")
    (tmp_path / "trusted" / "runtime").mkdir(parents=True)
    revs = {"base": Revision("base", "main", base_sha, tmp_path / "b"), "head": Revision("head", "pr", head_sha,
                                                                                         tmp_path / "h")}
    return ev, revs


def test_each_revision_gets_its_own_shas_compile_cache(tmp_path, monkeypatch):
    ev, revs = _evaluation(tmp_path, monkeypatch)
    procs = ev.make_procs(revs, [])
    dirs = {r: p.writable for r, p in procs.items()}
    assert dirs["base"] == [compile_cache.compile_cache_dir("a" * 40)]
    assert dirs["head"] == [compile_cache.compile_cache_dir("b" * 40)]
    assert dirs["reference"][0].name.startswith("trusted-")
    for r, p in procs.items():
        assert p.env_extra["TRITON_CACHE_DIR"].startswith(str(p.writable[0]) + "/")
        # Outside the per-process scratch, so the next process of the same SHA finds it.
        assert not p.env_extra["TRITON_CACHE_DIR"].startswith(str(p.workdir))
    assert "OMP_NUM_THREADS" not in procs["base"].env_extra or procs["base"].env_extra is not procs["head"].env_extra


def test_a_and_a_shares_one_cache(tmp_path, monkeypatch):
    ev, revs = _evaluation(tmp_path, monkeypatch, head_sha="a" * 40)
    procs = ev.make_procs(revs, [])
    assert procs["base"].writable == procs["head"].writable


@pytest.mark.parametrize("key", ["../../etc", "", "a/b", ".hidden", "x" * 200])
def test_cache_keys_must_look_like_shas(tmp_path, monkeypatch, key):
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError):
        compile_cache.compile_cache_dir(key)


def test_a_revision_cannot_write_another_shas_cache(tmp_path, monkeypatch):
    """The attack: a PR plants cubins in main's cache, so main would later load the PR's kernels."""
    if not sandbox.detect_isolation().method.startswith("bwrap"):  # "bwrap+seccomp+cgroup" on a full host
        pytest.skip("needs bubblewrap (Debian package bubblewrap): only bwrap confines writes")
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path / "cache"))
    own, other = compile_cache.compile_cache_dir("b" * 40), compile_cache.compile_cache_dir("a" * 40)
    code = ("import os, sys\n"
            "for d in sys.argv[1:]:\n"
            "    try:\n"
            "        open(os.path.join(d, 'planted'), 'w').write('x'); sys.stderr.write('WROTE ' + d + '\\n')\n"
            "    except OSError as e:\n"
            "        sys.stderr.write('DENIED ' + d + '\\n')\n")
    spec = sandbox.SandboxSpec(scratch=tmp_path / "scratch", writable=[own], read_only=[sys.prefix, sys.base_prefix],
                               env_extra=compile_cache.compile_cache_env(own))
    p = sandbox.spawn([sys.executable, "-I", "-c", code, str(own), str(other)], spec, log_path=tmp_path / "log")
    p.stdin.close()
    assert p.wait(timeout=60) == 0
    log = (tmp_path / "log").read_text()
    assert f"WROTE {own}" in log and f"DENIED {other}" in log, log
    assert not (other / "planted").exists()


# -- memory gates ------------------------------------------------------------------------------
GATES = [GateSpec("decode@128", "decode_tok_s", 128, 4), GateSpec("prefill@4096", "prefill_tok_s", 4096, 4096)]


def _judge(tmp_path, monkeypatch, base: dict, head: dict) -> ModelOutcome:
    ev, _ = _evaluation(tmp_path, monkeypatch)
    ev.profile = ev.profile.model_copy(update={"device": "cuda"})
    sweep = Sweep(GATES)
    sweep.gpu_memory = {**{("base", c): v for c, v in base.items()}, **{("head", c): v for c, v in head.items()}}
    out = ModelOutcome()
    judge_memory(ev.profile.models[0], GATES, sweep, out, settings=ev.settings, device=ev.profile.device)
    return out


def test_memory_regression_beyond_its_bound_is_reported(tmp_path, monkeypatch):
    gib = 1 << 30
    out = _judge(tmp_path, monkeypatch, {128: 10 * gib, 4096: 12 * gib}, {128: 10 * gib, 4096: 15 * gib})
    assert out.receipt["gate_memory"]["decode@128"]["regression"] is False
    assert out.receipt["gate_memory"]["prefill@4096"]["regression"] is True
    assert len(out.memory_failures) == 1 and "prefill@4096" in out.memory_failures[0]
    assert "12.00 → 15.00 GiB" in out.memory_failures[0]


def test_memory_within_bound_and_unknown_memory(tmp_path, monkeypatch):
    gib = 1 << 30
    out = _judge(tmp_path, monkeypatch, {128: 10 * gib, 4096: None}, {128: int(10.9 * gib), 4096: 20 * gib})
    assert out.memory_failures == []
    row = out.receipt["gate_memory"]["prefill@4096"]
    assert row["regression"] is None and "NVML" in row["reason"]  # unknown is null with a reason, never 0


def test_a_memory_regression_rejects(tmp_path, monkeypatch):
    ev, _ = _evaluation(tmp_path, monkeypatch)
    out = ModelOutcome(memory_failures=["m prefill@4096 peak GPU memory 12.00 → 15.00 GiB"])
    r = ev.decide({"m": out})
    assert r.verdict.value == "REJECT" and "15.00 GiB" in r.summary


class FakeProc:
    """Answers the sweep's requests; `fail_at` makes a prefill at that context run out of memory."""

    def __init__(self, role, fail_at=None):
        self.role, self.fail_at, self.track_cpu, self.staged = role, fail_at, False, {}
        self.last_oncpu_s, self.calls = None, []

    def pin(self):
        pass

    def freeze(self, on=True):  # the sweep freezes the revision not being timed
        pass

    def read_logits(self, resp, rows, phase):  # the last position's logits (shared memory in the real one)
        import numpy as np
        x = np.zeros((rows, 50), np.float32)
        x[:, 1] = 1.0
        return x

    def cpu_seconds(self):
        return None

    def request(self, op, *, phase, timeout, **kw):
        self.calls.append(op)
        if op == "stage":
            self.staged[kw["key"]] = len(kw["ids"])
            return {"ok": True}, 0.001
        if op == "prefill":
            if self.staged[kw["key"]] == self.fail_at:
                raise RevisionFault(self.role, phase, "oom", "CUDA out of memory")
            return {"ok": True, "argmax": 1, "finite": True, "nonzero": True, "spread": 1.0}, 0.01
        return {"ok": True, "ids": [1] * kw["n"]}, 0.01


def test_gpu_memory_is_read_once_per_role_and_context_in_ascending_order():
    procs = {"base": FakeProc("base"), "head": FakeProc("head")}
    reads = []
    sweep = run_sweep(procs, GATES, vocab=50, model_sha="x", pairs=2, warmup=1, timeout=5,
                      gpu_memory=lambda p: reads.append((p.role, len(reads))) or len(reads))
    assert sorted(sweep.gpu_memory) == [("base", 128), ("base", 4096), ("head", 128), ("head", 4096)]
    assert sweep.gpu_memory[("base", 128)] < sweep.gpu_memory[("base", 4096)]  # read during the first round
    assert len(reads) == 4


class BusyWhenIdle(FakeProc):
    """Uses `per_read` s of CPU between any two reads of its CPU clock (the sweep reads it around every
    timed request of the other revision): work it does after answering."""

    def __init__(self, role, per_read):
        super().__init__(role)
        self.per_read, self.used = per_read, 0.0

    def cpu_seconds(self):
        self.used += self.per_read
        return self.used


@pytest.mark.parametrize("per_read,caught", [(0.002, False), (0.05, True)])
def test_work_deferred_past_the_answer_is_named(per_read, caught):
    """A few ms of bookkeeping per request is an honest process; tens of ms is work moved off its own clock."""
    procs = {"base": FakeProc("base"), "head": BusyWhenIdle("head", per_read)}
    if not caught:
        run_sweep(procs, GATES, vocab=50, model_sha="x", pairs=4, warmup=0, timeout=5)
        return
    with pytest.raises(RevisionFault) as e:
        run_sweep(procs, GATES, vocab=50, model_sha="x", pairs=4, warmup=0, timeout=5)
    assert e.value.role == "head" and "kept computing after answering" in e.value.detail


def test_a_context_that_does_not_fit_is_named():
    procs = {"base": FakeProc("base"), "head": FakeProc("head", fail_at=4096)}
    with pytest.raises(RevisionFault) as e:
        run_sweep(procs, GATES, vocab=50, model_sha="x", pairs=2, warmup=1, timeout=5)
    assert e.value.kind == "oom" and "at context 4096 (prefill@4096)" in e.value.detail


# -- per-phase times, guard arithmetic -----------------------------------------------------------
def test_phases_are_timed(tmp_path, monkeypatch):
    ev, _ = _evaluation(tmp_path, monkeypatch)
    for event, info in (("load", {"model": "m"}), ("step", {}), ("accuracy", {"model": "m"}),
                        ("confirm", {"model": "m", "pair": 2})):
        ev.progress(event, **info)
    ev._clock_phase("done", {})
    assert [(p["phase"], p["pair"]) for p in ev._phases] == [("load", None), ("accuracy", None), ("confirm", 2)]
    assert all(p["seconds"] >= 0 and "_t0" not in p for p in ev._phases)


def test_guard_arithmetic_matches_the_numpy_formulas():
    rng = np.random.default_rng(0)
    ref_logits = rng.standard_normal((7, 301)).astype(np.float32) * 3
    rev = (ref_logits + 0.3 * rng.standard_normal((7, 301))).astype(np.float32)
    ref_lp = arith.log_softmax(ref_logits, arith.score_device("cpu"))
    np.testing.assert_allclose(ref_lp, _log_softmax(ref_logits).astype(np.float32), rtol=1e-6, atol=1e-6)
    top1, kl_mean, kl_max = arith.Reference(ref_lp, arith.score_device("cpu")).compare(rev)
    p = np.exp(ref_lp.astype(np.float64))
    kl = np.maximum((p * (ref_lp.astype(np.float64) - _log_softmax(rev))).sum(axis=-1), 0.0)
    assert top1 == pytest.approx(float((rev.argmax(-1) == ref_lp.argmax(-1)).mean()))
    assert kl_mean == pytest.approx(float(kl.mean()), rel=1e-9) and kl_max == pytest.approx(float(kl.max()), rel=1e-9)
    assert 0 < kl_mean < kl_max
