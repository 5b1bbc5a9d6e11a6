"""Which labels a result earns: `eval:<verdict>`, `eval-<model>:<tier>`, `regression-<model>-<gate>`."""
from __future__ import annotations

from bot.enums import model_label, regression_label, verdict_label
from worker.config import EvalSettings
from worker.records import EvalResult, GateResult, Verdict


def tier_of(rel_change: float, tiers: EvalSettings) -> Verdict:
    for verdict, floor in ((Verdict.XL, tiers.tier_xl), (Verdict.L, tiers.tier_l), (Verdict.M, tiers.tier_m),
                           (Verdict.S, tiers.tier_s)):
        if rel_change >= floor:
            return verdict
    return Verdict.NONE


def model_verdicts(result: EvalResult, tiers: EvalSettings) -> dict[str, Verdict]:
    """Per-model tier: REJECT on a failed guard or a regression, else the tier of its scored gate."""
    models = list(dict.fromkeys([g.model for g in result.guards] + [g.model for g in result.gates]))
    out: dict[str, Verdict] = {}
    for model in models:
        gates = [g for g in result.gates if g.model == model]
        if any(not g.passed for g in result.guards if g.model == model) or any(g.regression for g in gates):
            out[model] = Verdict.MIXED if result.verdict is Verdict.MIXED else Verdict.REJECT
            continue
        if result.verdict in (Verdict.UNCALIBRATED, Verdict.WITHHELD, Verdict.MIXED):
            out[model] = result.verdict  # no per-model tier either
            continue
        scored: list[GateResult] = [g for g in gates if g.scored and g.significant and g.rel_change is not None]
        out[model] = tier_of(max(g.rel_change for g in scored), tiers) if scored else Verdict.NONE
    return out


def labels_for(result: EvalResult, tiers: EvalSettings) -> list[str]:
    labels = [verdict_label(result.verdict)]
    if result.verdict in (Verdict.INFRA, Verdict.BUILD_FAILED):
        return labels  # nothing was measured: no per-model or regression claims
    labels += [model_label(m, v.value) for m, v in model_verdicts(result, tiers).items()]
    labels += [regression_label(g.model, g.gate) for g in result.gates if g.regression]
    return list(dict.fromkeys(labels))
