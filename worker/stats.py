"""Paired A/B statistics for speed gates: relative change, bootstrap interval, noise floor, tier.

Samples come in ABBA pairs (base and head measured next to each other), so the unit of
evidence is the pair's log ratio; drifts of the box that are slower than one pair cancel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Comparison:
    rel_change: float  # (head - base) / base, from the median paired log ratio
    ci_low: float
    ci_high: float
    n_pairs: int


def _check(base: list[float], head: list[float]) -> np.ndarray:
    if len(base) != len(head):
        raise ValueError(f"paired samples differ in length: base {len(base)}, head {len(head)}")
    if len(base) < 2:
        raise ValueError(f"need at least 2 pairs, got {len(base)}")
    b, h = np.asarray(base, dtype=float), np.asarray(head, dtype=float)
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(h)) and np.all(b > 0) and np.all(h > 0)):
        raise ValueError("speed samples must be finite and > 0")
    return np.log(h / b)


def compare(base: list[float], head: list[float], *, confidence: float = 0.95,
            n_resamples: int = 2000, seed: int = 0) -> Comparison:
    """Relative change of head vs base: median paired log ratio, with its bootstrap CI.

    The median, not the mean: one pair hit by a burst of load from another tenant must not move
    the estimate (the CPU boxes this runs on in CI are shared).
    """
    r = _check(base, head)
    est = float(np.median(r))
    if float(np.ptp(r)) == 0.0:
        lo = hi = est
    else:
        res = stats.bootstrap((r,), np.median, confidence_level=confidence, n_resamples=n_resamples,
                              method="percentile", rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Comparison(math.expm1(est), math.expm1(lo), math.expm1(hi), len(r))


def mann_whitney_p(base: list[float], head: list[float]) -> float:
    """Two-sided Mann-Whitney U p-value (unpaired), reported beside the bootstrap interval."""
    return float(stats.mannwhitneyu(head, base, alternative="two-sided").pvalue)


def noise_floor(aa_deltas: list[float], *, minimum: float, k: float = 3.0) -> float:
    """max(minimum, Q3 + k*IQR) of the absolute A/A relative changes recorded for one gate."""
    d = np.abs(np.asarray(aa_deltas, dtype=float))
    d = d[np.isfinite(d)]
    if d.size == 0:
        raise ValueError("no A/A deltas to compute a noise floor from")
    q1, q3 = np.percentile(d, [25, 75])
    return float(max(minimum, q3 + k * (q3 - q1)))


def significant(c: Comparison, floor: float) -> bool:
    """The interval excludes 0 and the change is bigger than the gate's noise floor."""
    excludes_zero = c.ci_low > 0 or c.ci_high < 0
    return excludes_zero and abs(c.rel_change) > floor
