"""Paired A/B statistics for speed gates: relative change, the interval over process pairs.

Samples come in ABBA reps (base and head measured next to each other), so drifts of the box that
are slower than one rep cancel in the rep's log ratio. Reps come from one or more *process pairs*
(fresh base and head processes); a process pair's own speed offset is the same in all its reps,
so resampling reps cannot see it (an interval over reps excluded 0 in 25-59 % of A/A runs with
1-2 % offsets). Significance is decided per process pair against the A/A floors
(worker/gates/noise.py); the interval in the comment is over process pairs (`pair_interval`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Comparison:
    rel_change: float  # (head - base) / base, from the median paired log ratio (of process pairs)
    ci_low: float | None
    ci_high: float | None
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


def pair_interval(deltas: list[float], *, aa_sd: float | None, aa_n: int, confidence: float = 0.95
                  ) -> tuple[float | None, float | None, str]:
    """Two-sided interval (log space) for the true log ratio from m process-pair deltas.

    The spread is the pair-to-pair sd: from the gate's A/A history (n pairs, t with n-1 df), or the
    head's own pairs when it is wider (a PR may be noisier than main); without history, the m pairs'
    own sd (t with m-1 df). One pair and no history: no interval, said so."""
    m = len(deltas)
    own = float(np.std(deltas, ddof=1)) if m >= 2 else None
    if aa_sd is not None and aa_n >= 3:
        sd, df = max(aa_sd, own or 0.0), aa_n - 1
        how = f"t over process pairs (pair spread from {aa_n} A/A pairs)"
    elif own is not None:
        sd, df = own, m - 1
        how = f"t over {m} process pairs (their own spread, no A/A history)"
    else:
        return None, None, "one process pair and no A/A history: no interval"
    mean = float(np.mean(deltas))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * sd / math.sqrt(m)
    return mean - half, mean + half, how


def compare_pairs(pairs: list[tuple[list[float], list[float]]], *, confidence: float = 0.95,
                  aa_sd: float | None = None, aa_n: int = 0, **_ignored) -> tuple[Comparison, list[float], str]:
    """Change = mean of the process-pair deltas; interval over process pairs (`pair_interval`).
    n_pairs counts process pairs."""
    deltas = [pair_delta(b, h) for b, h in pairs]
    lo, hi, how = pair_interval(deltas, aa_sd=aa_sd, aa_n=aa_n, confidence=confidence)
    est = float(np.mean(deltas))
    return (Comparison(math.expm1(est), math.expm1(lo) if lo is not None else None,
                       math.expm1(hi) if hi is not None else None, len(deltas)), deltas, how)


