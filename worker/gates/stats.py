"""Paired A/B statistics for speed gates: relative change, bootstrap interval, significance.

Samples come in ABBA reps (base and head measured next to each other), so drifts of the box that
are slower than one rep cancel in the rep's log ratio. Reps come from one or more *process pairs*
(fresh base and head processes); a process pair's own speed offset is the same in all its reps,
so significance is decided per process pair against the A/A floor (worker/gates/noise.py), and the
bootstrap interval over reps is an extra condition, never the only one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Comparison:
    rel_change: float  # (head - base) / base, from the median paired log ratio (of process pairs)
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


def pair_delta(base: list[float], head: list[float]) -> float:
    """One process pair's log ratio: the median of its reps' paired log ratios (head/base)."""
    return float(np.median(_check(base, head)))


def compare_pairs(pairs: list[tuple[list[float], list[float]]], *, confidence: float = 0.95,
                  n_resamples: int = 2000, seed: int = 0) -> tuple[Comparison, list[float]]:
    """Comparison over every rep of every process pair, its change the median of the pair deltas."""
    deltas = [pair_delta(b, h) for b, h in pairs]
    c = compare([x for b, _ in pairs for x in b], [x for _, h in pairs for x in h], confidence=confidence,
                n_resamples=n_resamples, seed=seed)
    return Comparison(math.expm1(float(np.median(deltas))), c.ci_low, c.ci_high, c.n_pairs), deltas


def beyond_floor(pair_deltas: list[float], log_floor: float) -> bool:
    """Every process pair's log ratio beyond ±log_floor, all on the same side."""
    return bool(pair_deltas) and (all(d < -log_floor for d in pair_deltas)
                                  or all(d > log_floor for d in pair_deltas))


def significant(c: Comparison, pair_deltas: list[float], log_floor: float, pairs_needed: int) -> bool:
    """At least `pairs_needed` process pairs, every one beyond the floor on the same side, and the
    reps' interval excludes 0."""
    excludes_zero = c.ci_low > 0 or c.ci_high < 0
    return len(pair_deltas) >= pairs_needed and beyond_floor(pair_deltas, log_floor) and excludes_zero
