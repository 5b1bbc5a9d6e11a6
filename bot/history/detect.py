"""Change points in main's history of one gate (tok/s over measured commits).

Library: `ruptures` (PELT search, least-squares cost). Chosen over `signal-processing-algorithms`'
E-Divisive because ruptures ships binary wheels for current Pythons and is maintained (SPA is an sdist
with a C extension and old pins), and because PELT with a penalty lets us *state* the false-alarm rate:
the penalty is set once on A/A histories (commits that change nothing, so every alarm is false) and the
rate it gives there is what we promise. E-Divisive's permutation test would give a per-split p-value but
costs hundreds of permutations per history on the publish worker.

How: log tok/s (a step is a ratio), scaled by a robust noise estimate taken from consecutive
differences (a step moves one difference, the noise moves them all), PELT with penalty
`PENALTY_PER_LOG_N * log(n)` and segments of at least `MIN_SEGMENT` commits; a change must also move the
level by at least `min_rel_step` (below it nobody can act on the alarm). Each split is then placed by least
squares within its two segments, and only claimed once `MIN_SEGMENT` commits lie on each side of that place:
PELT's minimum segment can otherwise force a split one commit early on a short history.

Stated false-alarm rate: at most `FALSE_ALARM_RATE` (2 %) of A/A histories raise an alarm *as the job uses
the detector*: it scans main's whole history again after every merge, and a change point once posted stays, so a
history is counted as alarmed when any of its scans, from `MIN_POINTS` merges up to its length, finds a change.
`false_alarm_rate()` simulates exactly that (`scripts/history_false_alarm.py` prints it and writes a receipt).
A first design measured one scan of a finished history (0.1 %) and started scanning at 6 merges with a penalty
of 10: as the job used it, 3-12 % of A/A histories growing to 60 merges alarmed (the noise estimate from a handful
of differences is unstable, and every scan is another chance). Now the first scan waits for 12 merges and the
penalty is 20. With no minimum step (the worst case; the rate does not depend on the noise level, values are
scaled by their own noise), 300 A/A histories each (history-false-alarm-20261205T211805Z.json): Gaussian noise
0.33 % growing to 60 merges, 0.00 % to 120; Student-t(5) 1.33 % and 0.67 %. The stated 2 % sits above the
heavy-tailed figure (4 of 300). A 5 % step at 1 % noise is found every time, 4 merges after it (median); a 3 %
step 97 % of the time, after 10.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import ruptures

MIN_SEGMENT = 3  # commits on each side: a change is claimed only once it has held for three measurements
PENALTY_PER_LOG_N = 20.0  # set on A/A histories scanned as the job scans them, see the module docstring
FALSE_ALARM_RATE = 0.02
MIN_POINTS = 12  # merges before the first scan: fewer give a noise estimate too unstable to scale by


@dataclass(frozen=True)
class Change:
    index: int  # first point at the new level
    before: float  # median tok/s of the segment before
    after: float  # median tok/s of the segment after

    @property
    def rel_step(self) -> float:
        return self.after / self.before - 1.0


def noise_scale(logs: np.ndarray) -> float:
    """Robust σ of one measurement: MAD of consecutive differences / √2 (insensitive to a few steps)."""
    d = np.diff(logs)
    mad = float(np.median(np.abs(d - np.median(d)))) * 1.4826 / math.sqrt(2)
    return max(mad, 1e-6)


def detect(values: list[float], min_rel_step: float = 0.0) -> list[Change]:
    """The level shifts in `values` (in commit order; all > 0), oldest first."""
    x = np.asarray(values, dtype=float)
    if len(x) < MIN_POINTS or not np.all(np.isfinite(x)) or np.any(x <= 0):
        return []
    logs = np.log(x)
    z = (logs - logs.mean()) / noise_scale(logs)
    ends = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit(z).predict(
        pen=PENALTY_PER_LOG_N * math.log(len(z)))
    bounds = [0, *ends]
    changes = []
    for i in range(1, len(bounds) - 1):
        a, c = bounds[i - 1], bounds[i + 1]
        k = _best_split(z, a, c)
        if k - a < MIN_SEGMENT or c - k < MIN_SEGMENT:
            continue  # the minimum segment forced PELT's split; claim it once enough commits show where it is
        change = Change(index=k, before=float(np.median(x[a:k])), after=float(np.median(x[k:c])))
        if abs(change.rel_step) >= min_rel_step:
            changes.append(change)
    return changes


def _best_split(z: np.ndarray, a: int, c: int) -> int:
    """The least-squares split of z[a:c] with any segment length (PELT's min_size can force a neighbour)."""
    def sse(v: np.ndarray) -> float:
        return float(((v - v.mean()) ** 2).sum())
    return min(range(a + 1, c), key=lambda k: sse(z[a:k]) + sse(z[k:c]))


def first_alarm(values: list[float], min_rel_step: float = 0.0) -> int | None:
    """As the job scans `values` (after each merge, from MIN_POINTS on): the history length at the first scan that
    finds a change, or None."""
    return next((k for k in range(MIN_POINTS, len(values) + 1) if detect(values[:k], min_rel_step)), None)


def false_alarm_rate(histories: int = 500, *, seed: int = 0, noise: str = "gauss", lengths=(12, 60),
                     sigma: float = 0.01, min_rel_step: float = 0.0) -> float:
    """Share of A/A histories (nothing changes: every alarm is false) in which any scan the job makes, one after
    each merge from MIN_POINTS on, finds a change."""
    rng = np.random.default_rng(seed)
    alarms = 0
    for _ in range(histories):
        n = int(rng.integers(lengths[0], lengths[1] + 1))
        e = rng.standard_normal(n) if noise == "gauss" else rng.standard_t(5, n)
        x = list(400.0 * np.exp(sigma * e))
        alarms += first_alarm(x, min_rel_step) is not None
    return alarms / histories
