"""Placebo study: many A/A evaluations of one revision against itself → how often it says REJECT.

Each evaluation is a real A/A measurement through the same pipeline code as a PR evaluation:
a fresh sandboxed base and head process pair, warm-up, ABBA sweep on fresh prompts, more fresh
pairs when a gate needs confirming, output check, statistics, verdict. To stay cheap, the trusted
reference process lives for the whole study and the accuracy guard is scored once. The first
`calibrate` runs only record one process pair's A/A deltas each (the floors), as
`tokengate calibrate` does; the evaluations after them are judged against those floors.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from worker import models as model_files
from worker.calibration.aa_store import AAStore
from worker.gates.bench import gate_specs
from worker.gates.stats import pair_delta
from worker.checkout import checkout_pair, remove_worktree
from worker.config import EvalSettings
from worker.guards.scoring import guard_bounds, guard_key, guard_result, reference_version, score_revisions
from worker.gates.judge import ModelOutcome
from worker.pipeline import Evaluation, Job
from worker.records import Verdict


@dataclass
class PlaceboReport:
    evaluations: int
    verdicts: dict[str, int]
    false_rejects: int
    seconds_per_evaluation: float
    # gate → A/A process-pair log ratios (calibration + placebo), and the null the placebo used
    deltas: dict[str, list[float]] = field(default_factory=dict)
    floors: dict[str, float] = field(default_factory=dict)
    pairs_needed: dict[str, int] = field(default_factory=dict)
    bounds: dict[str, float | None] = field(default_factory=dict)
    process_pairs: list[int] = field(default_factory=list)  # per placebo evaluation
    calibrate: int = 0  # the first `calibrate` deltas of each gate are the calibration pairs
    widening: dict[str, float] = field(default_factory=dict)  # per gate: the last evaluation's floor widening
    significant_evaluations: int = 0

    @property
    def false_tiers(self) -> int:
        return sum(v for k, v in self.verdicts.items() if k in ("S", "M", "L", "XL"))

    @property
    def false_significant(self) -> int:
        """Evaluations with any significant gate (either side): what the bound is about."""
        return self.significant_evaluations

    def noise_table(self) -> dict[str, dict]:
        out = {}
        for gate, d in self.deltas.items():
            a = np.expm1(np.abs(np.asarray(d)))
            floor = self.floors.get(gate)
            out[gate] = {"n": len(d), "median_abs": float(np.median(a)), "p95_abs": float(np.percentile(a, 95)),
                         "max_abs": float(a.max()), "floor": floor, "pairs_needed": self.pairs_needed.get(gate),
                         "bound_per_gate": self.bounds.get(gate),
                         # how far the floor sits above the A/A tail seen: > 1 = no pair reached it
                         "floor_over_p95": floor / float(np.percentile(a, 95)) if floor else None,
                         # judged pairs beyond the floor; the bound assumes 1/(n+1) (rank 1)
                         "judged_pairs_beyond": (int(np.sum(a[self.calibrate:] > floor)), len(a) - self.calibrate)
                         if floor else None}
        return out


def run_placebo(repo: str, ref: str, settings: EvalSettings, *, evaluations: int = 20, calibrate: int = 20,
                workdir: Path, store: AAStore, trusted_root: Path | None = None,
                model: str | None = None) -> PlaceboReport:
    job = Job(repo=repo, base_ref=ref, head_ref=ref, profile=settings.profile, models=[model] if model else None)
    ev = Evaluation(job, settings, trusted_root=trusted_root, store=store, workdir=workdir)
    p = ev.profile
    spec = next(m for m in p.models if m.role == "primary")
    gates = gate_specs(spec, p)
    resolved = model_files.resolve(spec, ev.trusted_root, ev.profile.device)
    git_dir, base, head = checkout_pair(repo, ref, ref, workdir)
    revs = ev.revs = {"base": base, "head": head}
    verdicts: dict[str, int] = {}
    deltas: dict[str, list[float]] = {g.name: [] for g in gates}
    nulls: dict = {}
    pairs_used: list[int] = []
    t_eval = 0.0
    n = 0  # process pairs started so far (each gets its own workdir)
    n_sig = 0
    try:
        first = ev.make_procs(revs, [resolved.path])
        with ExitStack() as outer:
            reference = outer.enter_context(first["reference"])
            reference.start(p.load_timeout_s)
            vocab = reference.request("load", path=str(resolved.path), device=p.device,
                                      max_context=p.max_context(spec), backend="reference", phase="load",
                                      timeout=p.load_timeout_s)[0]["vocab_size"]
            guard = None

            def pair():
                nonlocal n
                n += 1
                return ev.fresh_pair(revs, spec, resolved.path, n - 1, vocab)

            for i in range(calibrate + evaluations):
                judged = i >= calibrate
                t0 = time.monotonic()
                with pair() as procs:
                    if guard is None:
                        scores = score_revisions(procs, reference, vocab=vocab, model_sha=resolved.sha256,
                                                 ref_version=reference_version(ev.trusted_root), profile=p)
                        guard = guard_result(spec.name, scores, guard_bounds(
                            store.guard_aa(guard_key(resolved.sha256, reference_version(ev.trusted_root)),
                                           job.profile), len(p.seeds), settings))
                    out = ModelOutcome(guard=guard)
                    if judged:
                        ev.measure(spec, gates, {**procs, "reference": reference}, vocab, resolved.sha256, out,
                                   sweep_id=f"placebo{i}", more_pairs=lambda _j: pair())
                    else:  # a calibration pair is a sweep and its deltas, as the worker takes them (auto.run_pairs)
                        sw = ev._sweep(procs, gates, vocab, resolved.sha256, f"placebo{i}", spec)
                        out.pair_deltas = {g.name: [pair_delta(sw.values("base", g.name), sw.values("head", g.name))]
                                           for g in gates}
                for g, d in out.pair_deltas.items():
                    deltas[g].extend(d)
                if not judged:
                    ev.record_pair_deltas(spec, out, sha=base.sha)
                    continue
                r = ev.decide({spec.name: out})
                verdicts[r.verdict.value] = verdicts.get(r.verdict.value, 0) + 1
                n_sig += any(g.significant for g in r.gates)
                pairs_used.append(out.receipt["process_pairs"])  # gates may differ (worker/gates/confirm.py)
                nulls = out.receipt["noise_floors"]
                t_eval += time.monotonic() - t0
    finally:
        for rev in revs.values():
            remove_worktree(git_dir, rev)
    return PlaceboReport(evaluations=evaluations, verdicts=verdicts, false_rejects=verdicts.get(Verdict.REJECT.value, 0),
                         seconds_per_evaluation=t_eval / max(1, evaluations), deltas=deltas,
                         floors={g: v["floor"] for g, v in nulls.items()},
                         pairs_needed={g: v["pairs"] for g, v in nulls.items()},
                         bounds={g: v["bound"] for g, v in nulls.items()}, process_pairs=pairs_used,
                         widening={g: v.get("widening", 1.0) for g, v in nulls.items()},
                         calibrate=calibrate, significant_evaluations=n_sig)


def judge_blocks(deltas: dict[str, list[float]], nulls: dict) -> list[dict[str, int]]:
    """Recorded process pairs (oldest first, every gate measured in every pair) read as evaluations,
    exactly as the pipeline runs one: the first pair, then the next pairs while any gate still wants
    more (worker/gates/noise.py), then each gate's side (-1 slower, +1 faster, 0). Independent A/A (or
    A/B) pairs stand in for the fresh confirming pairs an evaluation would start. An evaluation the
    record runs out in the middle of is left out. The pipeline's confirming pairs may time fewer gates
    (worker/gates/confirm.py), but each gate's decision, and so the model's, is the one read here."""
    gates = list(deltas)
    n = min(len(v) for v in deltas.values()) if deltas else 0
    out, i = [], 0
    while i < n:
        block = [i]
        while any(nulls[g].wants_more([deltas[g][j] for j in block]) for g in gates) and block[-1] + 1 < n:
            block.append(block[-1] + 1)
        if any(nulls[g].wants_more([deltas[g][j] for j in block]) for g in gates):
            break
        out.append({g: nulls[g].significant([deltas[g][j] for j in block]) for g in gates} | {"_pairs": len(block)})
        i = block[-1] + 1
    return out
