"""Self-calibration: record A/A process pairs of main until every gate of the profile can back
the false-significance bound (or `calibration_pairs_target`, if larger).

Pairs, not whole evaluations: one checkout of main twice, one trusted reference for the
vocabulary, then fresh base-vs-base process pairs, each sweeping every gate of the model once;
every pair is an independent draw of each gate's null, taken whatever the earlier ones showed.
The accuracy guards' A/A seed scores are recorded from the first pairs too. Resumable: it counts
what the store already holds under this worker's calibration key (a re-created worker with the
same GPU, driver, torch and triton finds its history on the compose volume and records nothing).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from worker import models as model_files
from worker.calibration.aa_store import AAStore
from worker.calibration.history import gate_lineage
from worker.calibration import runtime_change
from worker.checkout import CheckoutError, checkout_pair, mirror, remove_worktree, resolve, subtree_id
from worker.config import EvalSettings
from worker.gates.bench import gate_specs
from worker.gates.noise import history_needed
from worker.gates.stats import pair_delta
from worker.guards.scoring import guard_key, reference_version, score_revisions


@dataclass
class CalibrationRun:
    key: str
    target: dict[str, int]  # "model gate" → A/A pairs wanted
    before: dict[str, int]
    after: dict[str, int] = field(default_factory=dict)
    pairs_recorded: int = 0
    seconds: float = 0.0
    per_pair_seconds: list[float] = field(default_factory=list)
    per_pair_phases: list[dict] = field(default_factory=list)  # model, load (slower side), guards, sweep: seconds
    done: bool = False
    stopped: str | None = None  # why it stopped before the target (time budget)
    # "model gate" → A/A pairs of a changed runtime wanted before its floor check (runtime_change.py)
    runtime_check: dict[str, int] = field(default_factory=dict)


def targets(ev, s: EvalSettings) -> dict[tuple[str, str], int]:
    per_side = s.false_significance_rate / ev.gate_count() / 2
    return {(m.name, g): max(s.calibration_pairs_target, history_needed(per_side, ev.profile.max_pairs_for(g)))
            for m in ev.profile.models for g in m.gate_names()}


def lineages(ev, runtime: str | None) -> dict[tuple[str, str], runtime_change.Lineage]:
    """Per gate, the A/A rows a floor for a base of `runtime` may use (worker/calibration/history.py)."""
    since = time.time() - ev.settings.aa_max_age_days * 86400
    return {(m.name, g): gate_lineage(ev.store, ev.host, ev.job.profile, ev.protocol_key(m.name), m.name, g,
                                      ev.settings, since, runtime)
            for m in ev.profile.models for g in m.gate_names()}


def counts(ev, runtime: str | None = None) -> dict[tuple[str, str], int]:
    return {k: len(ln.rows) for k, ln in lineages(ev, runtime).items()}


def base_runtime(ev) -> str | None:
    """The runtime tree id of the job's base, read from the mirror before any checkout (None: unknown,
    e.g. the repository cannot be fetched: the evaluation then says why)."""
    try:
        git_dir = mirror(ev.job.repo)
        return subtree_id(git_dir, ev.job.base_sha or resolve(git_dir, ev.job.base_ref), ev.settings.runtime_path)
    except (CheckoutError, OSError):
        return None


def calibrated(ev, runtime: str | None = None) -> bool:
    """Every gate has its target of A/A pairs of the base's lineage, and none waits for pairs of a
    changed runtime."""
    want, lines = targets(ev, ev.settings), lineages(ev, runtime)
    return all(len(lines[k].rows) >= n and not lines[k].wanted for k, n in want.items())


def idle_summary(receipt: dict | None) -> dict | None:
    """The idle-GPU check of one pair, short: whether it applied (and why not), how many timed windows
    it saw and could cover, and how many it voided. A calibration that never voids must show here
    whether that is because the idle revisions were idle or because the check could not look."""
    if receipt is None:
        return None
    out = {k: receipt.get(k) for k in ("applicable", "reason", "windows", "covered", "settle_s", "nvml_period_s")}
    out["voided"] = len(receipt.get("voided") or [])
    return out


def run_pairs(ev, *, want_more, on_pair, budget_s: float | None = None, t0: float | None = None,
              head_ref: str | None = None, head_sha: str | None = None, on_guard=None,
              phases: list | None = None, only: set[str] | None = None) -> tuple[int, list, str | None]:
    """Fresh process pairs of ev.job's base (vs `head_ref`, default: base itself), each sweeping every
    gate of a model once, while `want_more(spec, gates)`; `on_pair(spec, {gate: delta})` gets each.
    `on_guard(spec, gkey, scores)` scores the accuracy guards on a pair while it returns True.
    `phases` (a list) gets each pair's seconds by phase. `only`: these models' pairs alone (the others are not
    even loaded), guard models included.
    Returns (pairs, per-pair seconds, why it stopped early or None)."""
    t0 = time.monotonic() if t0 is None else t0
    job = ev.job
    ev.workdir.mkdir(parents=True, exist_ok=True)
    git_dir, base, head = checkout_pair(job.repo, job.base_ref, head_ref or job.base_ref, ev.workdir, job.base_sha,
                                        head_sha or (job.base_sha if head_ref is None else None))
    ev.revs = {"base": base, "head": head}
    ev.base_runtime = subtree_id(git_dir, base.sha, ev.settings.runtime_path)
    ref_version = reference_version(ev.trusted_root)
    n, per, stopped = 0, [], None
    try:
        for spec in ev.profile.models:
            if only is not None and spec.name not in only:
                continue
            gates = gate_specs(spec, ev.profile)
            resolved = model_files.resolve(spec, ev.trusted_root, ev.profile.device)
            gkey = guard_key(resolved.sha256, ref_version)
            procs = ev.make_procs(ev.revs, [resolved.path])
            with procs["reference"] as reference:
                reference.start(ev.profile.load_timeout_s)
                vocab = reference.request("load", path=str(resolved.path), device=ev.profile.device,
                                          max_context=ev.profile.max_context(spec), backend="reference",
                                          phase="load", timeout=ev.profile.load_timeout_s)[0]["vocab_size"]
                while want_more(spec, gates, gkey):
                    # Stop when the next pair would end past the budget (pieces of a bounded length);
                    # the first pair always runs, so every piece makes progress.
                    if budget_s is not None and per and time.monotonic() - t0 + max(per) > budget_s:
                        stopped = f"time budget of {budget_s:.0f} s used; run again to continue"
                        break
                    tp = time.monotonic()
                    with ev.fresh_pair(ev.revs, spec, resolved.path, n, vocab) as pair:
                        n += 1
                        tg = time.monotonic()
                        guard_split = None
                        if on_guard is not None and on_guard(spec, gkey, None):
                            scores = score_revisions(pair, reference, vocab=vocab, model_sha=resolved.sha256,
                                                     ref_version=ref_version, profile=ev.profile)
                            on_guard(spec, gkey, scores)
                            guard_split = {r: {k: round(v, 4) for k, v in sc.seconds.items()}
                                           for r, sc in scores.items()}
                        ts = time.monotonic()
                        sw = ev._sweep(pair, gates, vocab, resolved.sha256, f"pairs{n}", spec) if gates else None
                        te = time.monotonic()
                    on_pair(spec, {g.name: pair_delta(sw.values("base", g.name), sw.values("head", g.name))
                                   for g in gates})
                    per.append(round(time.monotonic() - tp, 3))
                    if phases is not None:
                        phases.append({"model": spec.name, "start_load": round(tg - tp, 2),
                                       "guards": round(ts - tg, 2), "sweep": round(te - ts, 2),
                                       "stop": round(time.monotonic() - te, 2),
                                       "guard_seconds": guard_split,
                                       "idle_gpu": idle_summary(sw.idle_gpu if sw is not None else None)})
            if stopped:
                break
    finally:
        for rev in ev.revs.values():
            remove_worktree(git_dir, rev)
    return n, per, stopped


def calibrate_pairs(repo: str, ref: str, settings: EvalSettings, *, store: AAStore | None = None,
                    workdir=None, trusted_root=None, budget_s: float | None = None, progress=None,
                    base_sha: str | None = None, device: str | None = None, models: list[str] | None = None,
                    only: set[str] | None = None) -> CalibrationRun:
    """Record A/A pairs of `ref` until every gate reaches its target, or `budget_s` runs out (`only`: of these
    models alone, guard models included: a bench's placebo that gives one model its pairs in one piece)."""
    from worker.pipeline import Evaluation, Job  # the pipeline imports this package

    job = Job(repo=repo, base_ref=ref, head_ref=ref, base_sha=base_sha, head_sha=base_sha,
              profile=settings.profile, device=device, models=models)
    ev = Evaluation(job, settings, store=store, workdir=workdir, trusted_root=trusted_root, progress=progress)
    want = targets(ev, settings)
    runtime = base_runtime(ev)  # run_pairs checks out this very commit (ev.base_runtime: the same tree)
    lines = lineages(ev, runtime)
    run = CalibrationRun(ev.host, {f"{m} {g}": n for (m, g), n in want.items()},
                         {f"{m} {g}": len(ln.rows) for (m, g), ln in lines.items()},
                         runtime_check={f"{m} {g}": ln.wanted for (m, g), ln in lines.items() if ln.wanted})
    t0 = time.monotonic()
    guard_wanted = math.ceil(settings.min_aa_samples / len(ev.profile.seeds))
    guards = {}

    def guards_have(gkey):
        if gkey not in guards:
            guards[gkey] = len(ev.store.guard_aa(gkey, job.profile)) // len(ev.profile.seeds)
        return guards[gkey]

    def short(spec, gates):  # a gate of this model below its target, or owed pairs of a changed runtime
        now = lineages(ev, ev.base_runtime)
        return any(len(now[(spec.name, g.name)].rows) < want[(spec.name, g.name)] or now[(spec.name, g.name)].wanted
                   for g in gates)

    def want_more(spec, gates, gkey):
        return short(spec, gates) or guards_have(gkey) < guard_wanted

    def on_guard(spec, gkey, scores):
        if scores is None:
            return guards_have(gkey) < guard_wanted
        ev._record_guard_aa(gkey, scores)
        guards[gkey] += 1
        return True

    def on_pair(spec, deltas):  # every gate of this pair: each is an independent draw of its null
        for g, d in deltas.items():
            ev.store.add_pair_delta(ev.host, job.profile, ev.protocol_key(spec.name), spec.name, g, d,
                                    sha=ev.revs["base"].sha, runtime=ev.base_runtime)

    n, per, stopped = run_pairs(ev, want_more=want_more, on_pair=on_pair, budget_s=budget_s, t0=t0,
                                on_guard=on_guard, phases=run.per_pair_phases, only=only)
    run.pairs_recorded, run.per_pair_seconds, run.stopped = n, per, stopped
    run.seconds = round(time.monotonic() - t0, 3)
    run.after = {f"{m} {g}": k for (m, g), k in counts(ev, ev.base_runtime).items()}
    run.done = calibrated(ev, ev.base_runtime)
    return run
