"""Main's runtime changed since a gate's A/A history was recorded: check its floor with fresh pairs.

A merge to main can make a gate's noise larger or smaller with no change of GPU, driver or library:
prefill CUDA graphs took the H200's 0.8B prefill@4096 A/A pair sd from 3.0 % to ~0.3 %
(gpu-calibration-standard-20261204T175855Z.json), so the old floor hid planted 1-2 % slowdowns there.

Every A/A row records the git tree id of the measured revision's runtime package
(`EvalSettings.runtime_path`). A gate's floor for a base whose runtime X came after history of
another runtime is built from X's *lineage*:
- fewer than `drift_window` A/A pairs of X: not calibrated, and it says so; the worker records them
  before evaluating (worker/calibration/auto.py);
- then X's first `drift_window` pairs are tested against the rows before X appeared, for spread either
  way (noisier breaks the bound, quieter throws sensitivity away) and location: the same noise pools
  X's pairs with that history; a different noise builds X's floor from X's own pairs only.
Nothing is stored or retired: the lineage is a function of the rows, so the same pairs always give
the same answer (repeating the test adds no false alarms), and evaluations of an older base (a late
event) read that runtime's own lineage instead of undoing the newer one's.

Rows recorded before runtimes were kept (NULL) are of unknown runtime: they never start a check.
"""
from __future__ import annotations

from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Lineage:
    rows: list[tuple[float, float]]  # (delta, created) newest first: what this runtime's floor is built from
    wanted: int = 0  # A/A pairs of this runtime still to record before its floor can be checked
    note: str | None = None  # why the floor is not the plain history's (for the gate's reason)


def change_p(first: list[float], before: list[float]) -> float:
    """p-value of 'a new runtime's first A/A pairs have the older history's noise': spread two-sided
    (Mann-Whitney on |delta|) and location (on delta), Bonferroni over the two."""
    spread = stats.mannwhitneyu([abs(x) for x in first], [abs(x) for x in before], alternative="two-sided").pvalue
    where = stats.mannwhitneyu(first, before, alternative="two-sided").pvalue
    return float(min(1.0, 2 * min(spread, where)))


def lineage(rows: list[tuple[float, float, str | None]], runtime: str | None, w: int, alpha: float) -> Lineage:
    """The rows (delta, created, runtime; newest first) a floor for `runtime` may use."""
    plain = [(d, c) for d, c, _ in rows]
    if runtime is None or not any(r is not None and r != runtime for _, _, r in rows):
        return Lineage(plain)
    mine = [(d, c) for d, c, r in rows if r == runtime]
    start = mine[-1][1] if mine else float("inf")
    before = [(d, c, r) for d, c, r in rows if c < start]
    if not before:  # this runtime's history came first: later runtimes' rows are theirs
        return Lineage(mine)
    was = next((r for _, _, r in before if r is not None), None)
    moved = f"main's runtime changed (runtime tree {(was or 'unknown')[:10]} -> {runtime[:10]})"
    older = [(d, c) for d, c, _ in before]
    if len(mine) < w:
        return Lineage(mine + older, w - len(mine),
                       f"{moved}: {len(mine)} of {w} A/A pairs of the new runtime recorded; the floor is checked "
                       "against them before it is used")
    p = change_p([d for d, _ in mine[-w:]], [d for d, _ in older])
    if p < alpha:
        return Lineage(mine, 0, f"{moved} and its A/A noise differs from the history's (p = {p:.1e} < {alpha:g}): "
                                "its floor is built from its own A/A pairs")
    return Lineage(mine + older)
