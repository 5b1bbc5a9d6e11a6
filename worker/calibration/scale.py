"""How much noisier this host is now than the A/A history a floor came from, with a known-size bound.

The floors (worker/gates/noise.py) are exact only while fresh pairs are drawn from the noise the
history was drawn from. A host that became 1.5x noisier keeps passing the drift test often enough
(8 pairs per gate see 1.5x only about two times in three) to put false significance above the
stated rate. So every null is also scaled by this ratio.

Model: the newest A/A pair deltas of a gate are its older ones times k (a scale family; A/A deltas
are symmetric about 0, so only their spread can change). Then log|new| - log|old| is a pure shift
by log k, and the Mann-Whitney count of positive differences, summed over the model's gates (each
gate compared only with itself, so no gate's units mix with another's), gives a distribution-free
upper confidence bound for k (Moses / Hodges-Lehmann, normal approximation of the summed count):
P(true k > `upper`) <= 1 - confidence. A noisier host is noisier on all its gates, so pooling sees
1.5x where one gate's 8 pairs cannot.

Widening the floors by c >= k restores the exact bound (a floor further out than the scaled history
floor can only be crossed less often); c = max(1, upper) is used, so an unchanged host pays only the
bound's own margin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class NoiseRatio:
    estimate: float  # Hodges-Lehmann estimate of k (new spread / old spread)
    upper: float  # upper confidence bound of k at `confidence`
    confidence: float
    p_noisier: float  # p-value of "not noisier than the history" (k <= 1)
    recent: int  # new deltas used, all gates together
    reference: int  # old deltas used, all gates together

    @property
    def widening(self) -> float:
        """Factor the floors are multiplied by (never below 1: a quieter host keeps its floors)."""
        return max(1.0, self.upper)


def _logabs(x: list[float]) -> np.ndarray:
    a = np.abs(np.asarray([v for v in x if math.isfinite(v)], dtype=float))
    return np.log(a[a > 0])


def noise_ratio(recent: dict[str, list[float]], reference: dict[str, list[float]],
                confidence: float) -> NoiseRatio | None:
    """k from the newest A/A deltas per gate against the older ones per gate; None if too few."""
    diffs, var, pos0 = [], 0.0, 0.0
    nr = no = 0
    for gate, new in recent.items():
        y, x = _logabs(new), _logabs(reference.get(gate, []))
        if len(y) == 0 or len(x) < 2:
            continue
        d = (y[:, None] - x[None, :]).ravel()
        diffs.append(d)
        var += len(y) * len(x) * (len(y) + len(x) + 1) / 12
        pos0 += float(np.sum(d > 0) + 0.5 * np.sum(d == 0))
        nr, no = nr + len(y), no + len(x)
    if not diffs or nr < 3:
        return None
    d = np.sort(np.concatenate(diffs))
    m = len(d)
    z = float(stats.norm.ppf(confidence))
    # S(t) = #{d > t} is the summed Mann-Whitney count at shift t; under the truth it has mean m/2 and
    # variance `var`. The upper bound is the t with only c differences above it, c its lower quantile.
    c = int(math.floor(m / 2 - z * math.sqrt(var)))
    upper = float(d[-1] + 1.0) if c < 0 else float(d[max(0, m - 1 - c)])
    p = float(stats.norm.sf((pos0 - m / 2 - 0.5) / math.sqrt(var)))
    return NoiseRatio(math.exp(float(np.median(d))), math.exp(upper), confidence, p, nr, no)
