"""The A/A null model of a speed gate: its two one-sided floors, and how many process pairs must agree.

The unit of evidence is one *process pair*: a fresh base process and a fresh head process,
measured ABBA; its delta is the median log ratio of its reps. Reps of one pair share the pair's
own speed offset (layout, allocation), so they cannot tell that offset from a real change; fresh
pairs can, because each draws a new offset.

Test. From n recorded A/A pair deltas of the gate (same calibration key and measurement
protocol), the slower floor `lo` is the rank-th smallest signed delta and the faster floor `hi`
the rank-th largest. A gate is significantly slower when all m fresh pairs land below `lo` (and
below 0), faster when all land above `hi`. If A/A pair deltas are exchangeable (iid draws of one
distribution, any shape), the chance of that for one side is, over the calibration draw,

    P = E[p^m],  p ~ Beta(rank, n + 1 - rank)  =  prod_{i<m} (rank + i) / (n + 1 + i)

exactly (scipy's beta-binomial), with no assumption about the tails. The *design* (m, rank) is a
function of n only — never of the deltas' values — so the bound stays exact: among the designs
whose bound is under the per-side rate, the one with the smallest detectable change under a
Gaussian working model is used. A larger history gives a higher rank, i.e. a floor further inside
the A/A spread, and a smaller detectable change: the floor is what the noise is, never widened
to a fixed minimum (the H200's ±0.1-0.4 % decode noise stays usable). Noisy gates get more pairs
(`ProfileSettings.gate_max_process_pairs`), not a wider floor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats


def exceed_bound(n: int, rank: int, pairs: int) -> float:
    """P(all `pairs` fresh A/A pairs land beyond the rank-th most extreme of n A/A deltas on one
    given side), exactly, under exchangeability."""
    if not 1 <= rank <= n:
        raise ValueError(f"rank {rank} must be in 1..{n}")
    return float(stats.betabinom.sf(pairs - 1, pairs, rank, n + 1 - rank))


def false_significance_bound(n: int, rank: int, pairs: int) -> float:
    """The same bound in closed form (kept for readers of older receipts): one side."""
    if not 1 <= rank <= n:
        raise ValueError(f"rank {rank} must be in 1..{n}")
    return math.prod((rank + i) / (n + 1 + i) for i in range(pairs))


@dataclass(frozen=True)
class Design:
    pairs: int  # m: fresh process pairs that must all agree
    rank: int  # floors are the rank-th most extreme A/A delta on each side
    bound_per_side: float
    mdc_sd: float  # detectable change at 90 % power, in units of the pair-delta sd (Gaussian working model)


@lru_cache(maxsize=4096)
def choose_design(n: int, per_side_rate: float, max_pairs: int, power: float = 0.9) -> Design | None:
    """The (pairs, rank) with the smallest detectable change whose one-sided bound is <= the rate.

    Depends on n only, so choosing it cannot bias the bound."""
    best = None
    for m in range(1, max_pairs + 1):
        if n < 1 or exceed_bound(n, 1, m) > per_side_rate:
            continue
        lo, hi = 1, n  # largest rank whose bound is under the rate (the bound grows with rank)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if exceed_bound(n, mid, m) <= per_side_rate:
                lo = mid
            else:
                hi = mid - 1
        r = lo
        mdc = float(stats.norm.ppf(1 - r / (n + 1)) + stats.norm.ppf(power ** (1 / m)))
        d = Design(m, r, exceed_bound(n, r, m), mdc)
        if best is None or d.mdc_sd < best.mdc_sd - 1e-9:
            best = d
    return best


def history_needed(per_side_rate: float, max_pairs: int) -> int:
    """Fewest A/A pair deltas for which some design meets the rate."""
    n = 1
    while exceed_bound(n, 1, max_pairs) > per_side_rate:
        n += 1
    return n


@dataclass(frozen=True)
class GateNull:
    """What one gate's A/A history allows: the floors, the agreeing pairs needed, the bound."""

    lo: float  # log ratio a pair must land below to count as slower (< 0)
    hi: float  # ... above to count as faster (> 0)
    pairs: int  # process pairs that must all agree on one side
    calibrated: bool
    aa_deltas: int
    bound: float | None  # P(false significance, either side) of this gate per evaluation; None = no guarantee
    rank: int | None = None
    aa_sd: float | None = None  # sd of the A/A pair deltas (the interval's spread over process pairs)
    state: str = "calibrated"  # calibrated | uncalibrated | drift
    reason: str | None = None
    widening: float = 1.0  # floors multiplied by the host's noise ratio bound (worker/calibration/scale.py)
    noise_ratio: float | None = None  # that ratio's estimate (new A/A spread / the history's)

    @property
    def log_floor(self) -> float:
        return max(self.hi, -self.lo)

    @property
    def floor(self) -> float:
        """The larger of the two floors as a relative speed change."""
        return math.expm1(self.log_floor)

    @property
    def floor_slower(self) -> float:
        """How much slower a pair must be to count as slower (> 0, a relative speed change)."""
        return -math.expm1(self.lo)

    @property
    def floor_faster(self) -> float:
        """How much faster a pair must be to count as faster (> 0)."""
        return math.expm1(self.hi)

    def side(self, deltas: list[float]) -> int:
        """-1: every pair so far below `lo`; +1: every pair above `hi`; 0 otherwise."""
        if not deltas:
            return 0
        if all(d < self.lo for d in deltas):
            return -1
        if all(d > self.hi for d in deltas):
            return 1
        return 0

    def significant(self, deltas: list[float]) -> int:
        return self.side(deltas) if len(deltas) >= self.pairs else 0

    def wants_more(self, deltas: list[float]) -> bool:
        """Another fresh pair can still change the answer (early stop is exact: a pair that missed
        the floor already decides 'not significant')."""
        return len(deltas) < self.pairs and self.side(deltas) != 0


def gate_null(aa_deltas: list[float], *, per_gate_rate: float, minimum: float, max_pairs: int,
              uncalibrated_floor: float, rank: int | None = None, state: str | None = None,
              reason: str | None = None) -> GateNull:
    """The null of one gate. `per_gate_rate` covers both sides; `rank` pins the rank (tests).

    `state="drift"` (set by worker/calibration/history.py) forces the uncalibrated null."""
    d = [x for x in aa_deltas if math.isfinite(x)]
    n = len(d)
    per_side = per_gate_rate / 2
    design = None if state == "drift" else choose_design(n, per_side, max_pairs)
    if design is not None and rank is not None:
        if exceed_bound(n, rank, design.pairs) <= per_side:
            design = Design(design.pairs, rank, exceed_bound(n, rank, design.pairs), design.mdc_sd)
    if design is None:
        need = history_needed(per_side, max_pairs)
        why = reason or (f"{n} A/A pair deltas for this gate on this worker; {need} give the {per_gate_rate:.1e} "
                         f"per-gate bound with {max_pairs} pairs (the worker records them itself; "
                         f"`tokengate calibrate` does it by hand)")
        u = math.log1p(uncalibrated_floor)
        return GateNull(-u, u, max_pairs, False, n, None, None,
                        float(np.std(d, ddof=1)) if n >= 3 else None, state or "uncalibrated", why)
    s = sorted(d)
    m = math.log1p(minimum)
    lo = min(s[design.rank - 1], -m, 0.0)
    hi = max(s[-design.rank], m, 0.0)
    return GateNull(lo, hi, design.pairs, True, n, 2 * design.bound_per_side, design.rank,
                    float(np.std(d, ddof=1)) if n >= 2 else None)


def widen(null: GateNull, ratio) -> GateNull:
    """The null with both floors multiplied (in log space) by the host's noise-ratio bound `ratio.widening`.

    If fresh pairs are k times as spread as the history and the factor is >= k, each floor lies
    beyond the history's floor scaled by k, so the exact bound above still holds."""
    from dataclasses import replace

    c = ratio.widening
    return replace(null, lo=null.lo * c, hi=null.hi * c, widening=c, noise_ratio=ratio.estimate,
                   aa_sd=None if null.aa_sd is None else null.aa_sd * c)  # the interval's spread, likewise
