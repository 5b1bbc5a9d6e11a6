"""The verdict of one evaluation from its gates, guards and output checks (pure: no I/O).

Order of the rules:
1. A failed accuracy guard or output check → REJECT.
2. A significant regression on any gate (beyond its own one-sided floor, worker/gates/noise.py):
   REJECT, or MIXED (named, labelled, never merged; `regression_policy`) when another gate is
   significantly faster. A speedup never hides a regression.
3. A gate whose A/A history cannot back the bound (or whose noise drifted) → UNCALIBRATED: no
   tier, no pass, never merged. (A regression beyond the uncalibrated floor in every pair still
   REJECTs under rule 2, said to have no calibrated bound.)
4. Tier from the conservative estimate: the lower end of the interval over process pairs of the
   best significantly faster scored gate, never its point estimate. Below tier S: `none`.

`settled` says when rule 1 or 2 has already decided REJECT, so that nothing measured after it could change
the verdict and the evaluation stops measuring (a REJECT in minutes, not after every model's every pair).
"""
from __future__ import annotations

from dataclasses import dataclass

from worker.config import EvalSettings
from worker.records import GateResult, GuardResult, Verdict


@dataclass
class Decision:
    verdict: Verdict
    summary: str
    best_speedup: float | None = None  # the conservative estimate behind the tier
    notes: list[str] | None = None


def _pct(x):
    return "n/a" if x is None else f"{x:+.1%}"


def _gate(g: GateResult) -> str:
    ci = f", interval over process pairs {_pct(g.ci_low)}..{_pct(g.ci_high)}" if g.ci_low is not None else ""
    return f"{g.model} {g.gate} {_pct(g.rel_change)}{ci}, floor {g.noise_floor:.2%}, {g.n_pairs} process pair(s)"


def settled(guards: list[GuardResult], failures: list[str], regressed: list[str], s: EvalSettings) -> str | None:
    """Why the verdict is REJECT whatever is measured next (None: it is not settled yet).

    A failed guard or output/memory check settles it (rule 1 has no exception). A regression settles it only
    under `regression_policy="reject"`: under "mixed" a significant speedup still to be measured would make
    it MIXED, so the rest must be measured. `regressed`: "model gate" of each significant regression."""
    failed = [f"{g.model} accuracy guard failed" for g in guards if not g.passed]
    if failed or failures:
        return "; ".join(failed + list(failures))
    if regressed and s.regression_policy == "reject":
        return "regression on " + ", ".join(regressed)
    return None


def decide(gates: list[GateResult], guards: list[GuardResult], output_failures: list[str],
           uncalibrated: dict[str, str], s: EvalSettings) -> Decision:
    """`uncalibrated`: "model gate" → why its null has no bound."""
    problems = [f"{g.model} accuracy guard failed: {g.reason}" for g in guards if not g.passed]
    problems += list(output_failures)
    slower = [g for g in gates if g.regression]
    faster = [g for g in gates if g.significant and (g.rel_change or 0) > 0]
    unbounded = [g for g in slower if f"{g.model} {g.gate}" in uncalibrated]
    notes = [f"{k}: {v}" for k, v in uncalibrated.items()]
    reg = [f"{_gate(g)} regressed" + (" (uncalibrated floor: no bound)" if g in unbounded else "") for g in slower]
    if problems:
        return Decision(Verdict.REJECT, "Rejected: " + "; ".join(problems + reg) + ".", notes=notes)
    if slower and faster and s.regression_policy == "mixed":
        return Decision(Verdict.MIXED, "Mixed: " + "; ".join(reg) + "; while " + "; ".join(
            f"{_gate(g)} is faster" for g in faster) + ". A regression is never traded for a speedup: no tier, "
            "not merged.", notes=notes)
    if slower:
        extra = (" (beside a speedup on " + ", ".join(f"{g.model} {g.gate}" for g in faster) + ")") if faster else ""
        return Decision(Verdict.REJECT, "Rejected: " + "; ".join(reg) + extra + ".", notes=notes)
    if uncalibrated:
        return Decision(Verdict.UNCALIBRATED, "Uncalibrated: no tier, no pass, never merged. "
                        + "; ".join(f"{k}: {v}" for k, v in uncalibrated.items()) + ".", notes=notes)
    wins = [g for g in faster if g.scored and g.ci_low is not None]
    best = max(wins, key=lambda g: g.ci_low, default=None)
    if best is None:
        return Decision(Verdict.NONE, "No significant change on the scored gates; all guards pass.", notes=notes)
    tier = Verdict(s.tier_for(best.ci_low))
    if tier is Verdict.NONE:
        return Decision(Verdict.NONE, f"Faster but below tier S at the conservative end: {_gate(best)}; "
                        "all guards pass.", best.ci_low, notes)
    return Decision(tier, f"{tier.value} from the conservative estimate {_pct(best.ci_low)} (lower end of the "
                    f"interval over process pairs): {_gate(best)}; all guards pass.", best.ci_low, notes)
