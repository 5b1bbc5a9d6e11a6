"""One fresh base-vs-base process pair per evaluation, recorded as A/A history.

It keeps the null true as the service runs: the drift test (worker/calibration/history.py)
compares these newest pairs with the history the floor came from. The pair is owed by every
evaluation whose gates ran, whatever they showed, so it is an unbiased draw of the null.

It is taken after the verdict, not inside it (`owe` during the evaluation, `record_owed` after): the
verdict's floors were read before it and it says nothing about the PR, so a maintainer should not wait for
it (a 9B pair is ~45 s of a warm A/A's 335 s, gpu-e2e-h100-20261206T204709Z.json). The worker records it
before it takes the next job (worker/queue/tasks.py), on a fresh checkout of the same base, with the GPU to
itself. Its failure is noted in the upkeep report and costs the evaluation nothing.
"""
from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass

from worker.checkout import CheckoutError, add_worktree, remove_worktree
from worker.verdicts.faults import EvalFault
from worker.gates.stats import pair_delta
from worker.harness.client import RevisionFault

OWED_NOTE = "owed: recorded after the verdict, before the worker's next job (worker/calibration/sentinel.py)"


@dataclass
class OwedPair:
    spec: object  # ModelSpec
    gates: list
    path: object  # the model file
    sha256: str
    vocab: int


def enabled(setting: str, device: str) -> bool:
    return setting == "always" or (setting == "gpu" and device.startswith("cuda"))


def owe(ev, spec, gates, resolved, vocab: int, out) -> None:
    """Note the pair this evaluation owes for `spec` (its receipt says so); `record_owed` takes it."""
    if not enabled(ev.settings.sentinel_aa_pair, ev.profile.device) or "base" not in ev.revs:
        return
    ev.__dict__.setdefault("_owed_sentinels", []).append(OwedPair(spec, gates, resolved.path, resolved.sha256, vocab))
    out.receipt["sentinel_aa_pair"] = {"recorded": None, "note": OWED_NOTE}


def forgive(ev, why: str) -> None:
    """Drop what `ev` owes: its box failed a check (an INFRA verdict), so its noise is not the null's."""
    if getattr(ev, "_owed_sentinels", None):
        ev._owed_sentinels = []
        ev._owed_dropped = why


def record_owed(ev) -> dict:
    """Take every pair `ev` owes, on a fresh worktree of its base in a folder of its own (a retry of the same
    evaluation may already be using the evaluation's); per model {recorded, deltas | reason}, and the phases it
    went through (`sentinel` per model). Never raises for a pair's failure."""
    owed, ev._owed_sentinels = getattr(ev, "_owed_sentinels", []), []
    git_dir, base = getattr(ev, "_git_dir", None), ev.revs.get("base")
    if not owed or git_dir is None or base is None:
        return {"dropped": ev._owed_dropped} if getattr(ev, "_owed_dropped", None) else {}
    ev._phases, ev._pair_loads = [], []  # the verdict's receipt keeps its own lists: these are the upkeep's
    ev._deadline = time.monotonic() + ev.profile.eval_timeout_s
    ev.workdir = ev.workdir.with_name(f"{ev.workdir.name}-upkeep-{uuid.uuid4().hex[:8]}")
    report: dict = {}
    try:
        try:
            rev = add_worktree(git_dir, base.sha, ev.workdir / "base", "base", base.ref)
        except (CheckoutError, OSError, subprocess.TimeoutExpired) as exc:
            return {p.spec.name: {"recorded": False, "reason": f"checkout: {exc}"[:300]} for p in owed}
        try:
            for p in owed:
                report[p.spec.name] = _record(ev, rev, p)
        finally:
            remove_worktree(git_dir, rev)
            ev._clock_phase("done", {})
    finally:
        if not ev.keep_workdir:
            shutil.rmtree(ev.workdir, ignore_errors=True)
    report["phases"] = ev._phases
    return report


def _record(ev, rev, p: OwedPair) -> dict:
    try:
        ev.progress("sentinel", model=p.spec.name)  # its own phase: a fresh pair's load and sweep
        with ev.fresh_pair({"base": rev, "head": rev}, p.spec, p.path, 1000, p.vocab) as pair:
            # the GPU must be the pair's alone, as it was for the verdict's pairs (nothing of the head left on it)
            ev._foreign_gpu_check(pair, "before the A/A sentinel pair")
            sw = ev._sweep(pair, p.gates, p.vocab, p.sha256, f"{ev.eval_id}/sentinel", p.spec)
            ev._foreign_gpu_check(pair, "after the A/A sentinel pair")
    except (EvalFault, RevisionFault) as exc:
        return {"recorded": False, "reason": f"{type(exc).__name__}: {exc}"[:300]}
    protocol = ev.protocol_key(p.spec.name)
    deltas = {}
    for g in p.gates:
        deltas[g.name] = pair_delta(sw.values("base", g.name), sw.values("head", g.name))
        ev.store.add_pair_delta(ev.host, ev.job.profile, protocol, p.spec.name, g.name, deltas[g.name], sha=rev.sha,
                                runtime=ev.base_runtime)
    return {"recorded": True, "deltas": deltas}
