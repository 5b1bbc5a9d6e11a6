"""Placebo study: many A/A evaluations of one revision against itself → how often it says REJECT.

Each evaluation is a real A/A measurement through the same pipeline code as a PR evaluation:
fresh sandboxed base and head processes, warm-up, ABBA sweep on fresh prompts, output check,
statistics, verdict. To stay cheap, the trusted reference process lives for the whole study and
the accuracy guard is scored once. The first `calibrate` evaluations only record A/A deltas
(the noise floors), as `tokengate calibrate` does.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import models as model_files
from .aa_store import AAStore
from .bench import gate_specs
from .checkout import checkout_pair, remove_worktree
from .config import EvalSettings
from .guards import guard_bounds, guard_result, reference_version, score_revisions
from .pipeline import Evaluation, Job, ModelOutcome
from .records import Verdict


@dataclass
class PlaceboReport:
    evaluations: int
    verdicts: dict[str, int]
    false_rejects: int
    seconds_per_evaluation: float
    # gate → A/A relative changes (calibration + placebo), and the floor used for the placebo
    deltas: dict[str, list[float]] = field(default_factory=dict)
    floors: dict[str, float] = field(default_factory=dict)

    def noise_table(self) -> dict[str, dict]:
        out = {}
        for gate, d in self.deltas.items():
            a = np.abs(np.asarray(d))
            out[gate] = {"n": len(d), "median_abs": float(np.median(a)), "p95_abs": float(np.percentile(a, 95)),
                         "max_abs": float(a.max()), "floor": self.floors.get(gate)}
        return out


def run_placebo(repo: str, ref: str, settings: EvalSettings, *, evaluations: int = 20, calibrate: int = 10,
                workdir: Path, store: AAStore, trusted_root: Path | None = None,
                model: str | None = None) -> PlaceboReport:
    job = Job(repo=repo, base_ref=ref, head_ref=ref, profile=settings.profile, models=[model] if model else None)
    ev = Evaluation(job, settings, trusted_root=trusted_root, store=store, workdir=workdir)
    p = ev.profile
    spec = next(m for m in p.models if m.role == "primary")
    gates = gate_specs(spec, p)
    resolved = model_files.resolve(spec, ev.trusted_root)
    git_dir, base, head = checkout_pair(repo, ref, ref, workdir)
    revs = {"base": base, "head": head}
    verdicts: dict[str, int] = {}
    deltas: dict[str, list[float]] = {g.name: [] for g in gates}
    floors: dict[str, float] = {}
    total = calibrate + evaluations
    t_eval = 0.0
    n = 0
    try:
        # The trusted reference lives for the whole study; base and head are fresh processes for
        # every evaluation, as in a real one (each process pair has its own small layout bias, which
        # is part of the A/A noise the floors must cover).
        first = ev.make_procs(revs, [resolved.path])
        with ExitStack() as outer:
            reference = outer.enter_context(first["reference"])
            reference.start(p.load_timeout_s)
            vocab = reference.request("load", path=str(resolved.path), device=p.device,
                                      max_context=p.max_context(spec), backend="reference", phase="load",
                                      timeout=p.load_timeout_s)[0]["vocab_size"]
            guard = None
            while n < total:
                procs = {**ev.make_procs(revs, [resolved.path]), "reference": reference}
                for r in ("base", "head"):
                    procs[r].workdir = workdir / "proc" / f"{r}{n}"
                with ExitStack() as stack:
                    for r in ("base", "head"):
                        stack.enter_context(procs[r])
                        procs[r].start(None)
                    for r in ("base", "head"):
                        procs[r].finish_start(p.load_timeout_s)
                        procs[r].begin("load", path=str(resolved.path), device=p.device,
                                       max_context=p.max_context(spec), backend=p.backend)
                    for r in ("base", "head"):
                        procs[r].finish(phase="load", timeout=p.load_timeout_s)
                    if guard is None:
                        scores = score_revisions({"base": procs["base"], "head": procs["head"]}, reference,
                                                 vocab=vocab, model_sha=resolved.sha256,
                                                 ref_version=reference_version(ev.trusted_root), profile=p)
                        guard = guard_result(spec.name, scores, guard_bounds(
                            store.guard_scores(ev.host, job.profile, spec.name), len(p.seeds), settings))
                    t0 = time.monotonic()
                    out = ModelOutcome(guard=guard)
                    ev.measure(spec, gates, procs, vocab, resolved.sha256, out,
                               sweep_id=f"placebo{n}")
                    for g in out.gates:
                        deltas[g.gate].append(g.rel_change)
                    if n < calibrate:
                        for g in out.gates:
                            store.add_gate_delta(ev.host, job.profile, spec.name, g.gate, g.rel_change, sha=base.sha)
                    else:
                        r = ev.decide({spec.name: out})
                        verdicts[r.verdict.value] = verdicts.get(r.verdict.value, 0) + 1
                        floors = {g.gate: g.noise_floor for g in out.gates}
                        t_eval += time.monotonic() - t0
                    n += 1
    finally:
        for rev in revs.values():
            remove_worktree(git_dir, rev)
    return PlaceboReport(evaluations=evaluations, verdicts=verdicts, false_rejects=verdicts.get(Verdict.REJECT.value, 0),
                         seconds_per_evaluation=t_eval / max(1, evaluations), deltas=deltas, floors=floors)
