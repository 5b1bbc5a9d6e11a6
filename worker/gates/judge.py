"""A model's timed sweeps judged: each gate against its null, the output checks against base's, peak GPU memory
and the timed requests' KL. What it finds goes into the model's `ModelOutcome`; the verdict over every model is
worker/verdicts/rules.py's."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from worker.config import EvalSettings, ModelSpec, ProfileSettings
from worker.gates.bench import GateSpec
from worker.gates.noise import GateNull
from worker.gates.stats import compare_pairs, mann_whitney_p, pair_delta
from worker.gates.verify import LogitCheck, OutputCheck, judge_logits, judge_steps, merge_output_checks
from worker.records import GateResult, GuardResult, InfraKind
from worker.verdicts.faults import infra


@dataclass
class ModelOutcome:
    gates: list[GateResult] = field(default_factory=list)
    guard: GuardResult | None = None
    output_failures: list[str] = field(default_factory=list)
    receipt: dict = field(default_factory=dict)
    pair_deltas: dict[str, list[float]] = field(default_factory=dict)  # gate → log ratio of each process pair
    uncalibrated: dict[str, str] = field(default_factory=dict)  # "model gate" → why its null has no bound
    memory_failures: list[str] = field(default_factory=list)


def pair_deltas(sweeps, gate: str) -> list[float]:
    """The gate's log speed ratio head/base of each process pair that timed it."""
    return [pair_delta(sw.values("base", gate), sw.values("head", gate)) for sw in sweeps if sw.times(gate)]


def no_pass_possible(model: str, gates: list[GateSpec], sweeps: list, nulls: dict[str, GateNull]) -> str | None:
    """Why this model's outputs are checked on the first pair's verified rep only (None: every pair, every
    timed prefill). The checks exist so that no pass or tier rests on work a revision skipped; where a gate is
    significantly slower and none faster, the verdict is REJECT (or MIXED, if another model speeds up)
    whatever the outputs are. The verified rep still holds base to its own bars (a broken main is INFRA, never
    the PR's REJECT) and catches a head wrong throughout. On the 9B each pair's full check costs the fp32
    reference ~2 minutes (gpu-e2e-h100-20261206T204709Z.json)."""
    sides = {g.name: nulls[g.name].significant(pair_deltas(sweeps, g.name)) for g in gates}
    slower = [g for g, side in sides.items() if side < 0]
    if not slower or any(side > 0 for side in sides.values()):
        return None
    return (f"outputs checked on the first process pair's verified rep only: {model} is significantly "
            f"slower on {', '.join(slower)} and faster on no gate, so no output can make this verdict a pass or "
            "a tier")


def merge_checks(checks: list[dict]) -> dict:
    """One output check per (role, gate) over every process pair's verified reps."""
    return {key: merge_output_checks([c[key] for c in checks if key in c]) for key in checks[0]}


def gate_results(spec: ModelSpec, gates: list[GateSpec], sweeps: list, checks: dict, nulls: dict[str, GateNull],
                 out: ModelOutcome, *, settings: EvalSettings, profile: ProfileSettings,
                 gate_count: int) -> list[GateResult]:
    """Each gate over every process pair that timed it, against its null; its output checks judged on the way.
    `gate_count`: the evaluation's gates (every model's), over which the false-significance rate is split."""
    s, p = settings, profile
    results, floors, checks_r = [], {}, {}
    for g in gates:
        pairs = [(sw.values("base", g.name), sw.values("head", g.name)) for sw in sweeps if sw.times(g.name)]
        for b, h in pairs:
            if len(b) != p.pairs or len(h) != p.pairs:
                raise infra(InfraKind.MISSING_METRIC, f"{spec.name} {g.name}: {len(b)}/{len(h)} samples, "
                                                      f"expected {p.pairs} reps")
        b, h = [x for b, _ in pairs for x in b], [x for _, h in pairs for x in h]
        null = nulls[g.name]
        c, deltas, how = compare_pairs(pairs, confidence=s.confidence, aa_sd=null.aa_sd, aa_n=null.aa_deltas)
        out.pair_deltas[g.name] = deltas
        floor = null.floor
        floors[g.name] = {**asdict(null), "floor": floor, "floor_slower": null.floor_slower,
                          "floor_faster": null.floor_faster,
                          "pair_deltas": deltas, "interval": how,
                          "false_significance_rate": s.false_significance_rate, "gates": gate_count,
                          "mann_whitney_p": mann_whitney_p(b, h)}
        if not null.calibrated:
            out.uncalibrated[f"{spec.name} {g.name}"] = null.reason or null.state
        side = null.significant(deltas)
        hc, bc = checks[("head", g.name)], checks[("base", g.name)]
        checks_r[g.name] = {"head": asdict(hc), "base": asdict(bc)}
        judge_output(spec.name, g.name, hc, bc, out, profile=p)
        results.append(GateResult(
            model=spec.name, gate=g.name, metric=g.metric, base_median=statistics.median(b),
            head_median=statistics.median(h), rel_change=c.rel_change, ci_low=c.ci_low, ci_high=c.ci_high,
            noise_floor=floor, significant=side != 0, regression=side < 0,
            scored=spec.is_scored(g.name), n_pairs=c.n_pairs, reason=None if null.calibrated else null.reason,
            floor_slower=null.floor_slower, floor_faster=null.floor_faster, floor_widening=null.widening,
            not_confirmed=g.name in out.receipt.get("gates_not_confirmed", {})))
    out.receipt["noise_floors"] = floors
    out.receipt["output_checks"] = checks_r
    return results


def judge_output(model: str, gate: str, head: OutputCheck, base: OutputCheck, out: ModelOutcome, *,
                 profile: ProfileSettings) -> None:
    """The timed outputs' agreement with the reference and their decode steps, the head's against base's; base
    below its own bar is INFRA (a broken main), never the PR's REJECT."""
    bar = profile.output_min_agree
    if base.agree is None or head.agree is None:
        raise infra(InfraKind.MISSING_METRIC, f"{model} {gate}: output check had nothing to check")
    if base.agree < bar:
        raise infra(InfraKind.BASELINE_CRASHED, f"{model} {gate}: the baseline's outputs agree with the "
                    f"reference on only {base.agree:.0%} of tokens (< {bar:.0%}); cannot judge the PR")
    if head.agree < bar:
        out.output_failures.append(f"{model} {gate}: head's outputs agree with the reference on "
                                   f"{head.agree:.0%} of {head.checked_tokens} tokens (< {bar:.0%})")
    p = profile
    out.output_failures.extend(judge_steps(model, gate, head, base, extra_misses=p.output_extra_misses,
                                           floor=p.output_kl_floor, ratio=p.output_kl_ratio,
                                           base_max=p.output_kl_base_max))


def judge_timed_logits(model: str, gates: list[GateSpec], per_sweep: list[dict], out: ModelOutcome, *,
                       profile: ProfileSettings) -> None:
    """The timed requests' KL to the reference over every checked pair, the head's against base's."""
    p = profile
    rec = {}
    for g in gates:
        merged = {}
        for r in ("base", "head"):
            parts = [c[(r, g.name)] for c in per_sweep if (r, g.name) in c]
            vals = [x for x in parts if x.kl_mean is not None]
            n = sum(x.checked for x in vals)
            merged[r] = LogitCheck(sum(x.kl_mean * x.checked for x in vals) / n if n else None,
                                   max((x.kl_max for x in vals), default=None), n, parts[0].reason)
        rec[g.name] = {r: asdict(c) for r, c in merged.items()}
        failure = judge_logits(model, g.name, merged["head"], merged["base"], floor=p.output_kl_floor,
                               ratio=p.output_kl_ratio, base_max=p.output_kl_base_max)
        if failure:
            out.output_failures.append(failure)
    out.receipt["timed_logit_checks"] = rec


def judge_memory(spec: ModelSpec, gates: list[GateSpec], sweep, out: ModelOutcome, *, settings: EvalSettings,
                 device: str) -> None:
    """Memory gates: each gate's peak GPU memory, base vs head; a rise beyond the bound is a regression."""
    s = settings
    rows = {}
    for g in gates:
        b, h = sweep.gpu_memory.get(("base", g.context)), sweep.gpu_memory.get(("head", g.context))
        row = {"base_peak_gpu_bytes": b, "head_peak_gpu_bytes": h, "bound": s.memory_bound,
               "slack_bytes": s.memory_slack_bytes, "regression": None}
        if b is None or h is None:
            row["reason"] = ("CPU evaluation" if not device.startswith("cuda")
                             else "NVML reported no per-process GPU memory")
        else:
            row["regression"] = h > b * (1 + s.memory_bound) + s.memory_slack_bytes
            if row["regression"]:
                out.memory_failures.append(
                    f"{spec.name} {g.name} peak GPU memory {b / 2**30:.2f} → {h / 2**30:.2f} GiB "
                    f"({(h - b) / b:+.0%}; bound +{s.memory_bound:.0%} + {s.memory_slack_bytes >> 20} MiB)")
        rows[g.name] = row
    out.receipt["gate_memory"] = rows
