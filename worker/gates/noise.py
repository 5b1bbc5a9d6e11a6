"""The A/A null model of a speed gate: its floor, and how many process pairs must agree.

The unit of evidence is one *process pair*: a fresh base process and a fresh head process,
measured ABBA; its delta is the median log ratio of its reps. Reps of one pair share the pair's
own speed offset (layout, allocation; 2-12% on the shared CPU box), so they cannot tell that
offset from a real change; fresh pairs can, because each draws a new offset.

Floor: the `rank`-th largest |delta| (log ratio) of n recorded A/A pair deltas of the gate (host, profile and
measurement protocol). If A/A pair deltas are exchangeable (iid draws of one distribution, any
shape), the chance that a new A/A pair exceeds it is p ~ Beta(rank, n + 1 - rank) over the
calibration draw, so the chance that m fresh pairs all do is

    E[p^m] = prod_{i<m} (rank + i) / (n + 1 + i)

exactly, with no assumption about the distribution's tails (which 20-40 A/A runs cannot pin
down at the 1e-4 level a Gaussian fit would claim). A gate is significant only when m pairs all
land beyond the floor on the same side, m chosen so that this bound, summed over the gates of an
evaluation, stays under the configured false-significance rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def false_significance_bound(n: int, rank: int, pairs: int) -> float:
    """P(all `pairs` fresh A/A pairs exceed the rank-th largest of n A/A |deltas|), exactly."""
    if not 1 <= rank <= n:
        raise ValueError(f"rank {rank} must be in 1..{n}")
    return math.prod((rank + i) / (n + 1 + i) for i in range(pairs))


def pairs_needed(n: int, rank: int, per_gate_rate: float, max_pairs: int) -> int | None:
    """Fewest agreeing pairs (<= max_pairs) whose bound is <= per_gate_rate; None if none is."""
    if n < rank:
        return None
    for m in range(1, max_pairs + 1):
        if false_significance_bound(n, rank, m) <= per_gate_rate:
            return m
    return None


def floor_from_history(aa_deltas: list[float], *, rank: int, minimum: float) -> float:
    """max(log1p(minimum), rank-th largest |A/A pair log ratio|), in log space; a larger floor only
    lowers the bound."""
    d = sorted((abs(x) for x in aa_deltas if math.isfinite(x)), reverse=True)
    if len(d) < rank:
        raise ValueError(f"{len(d)} A/A deltas, the floor needs at least {rank}")
    return max(math.log1p(minimum), d[rank - 1])


@dataclass(frozen=True)
class GateNull:
    """What one gate's A/A history allows: the floor, the agreeing pairs needed, the bound."""

    log_floor: float  # |log(head/base)| a pair must exceed
    pairs: int  # process pairs that must agree beyond the floor
    calibrated: bool
    aa_deltas: int
    bound: float | None  # P(false significance) of this gate per evaluation; None = no guarantee
    reason: str | None = None

    @property
    def floor(self) -> float:
        """The floor as a relative speed change (the speedup side; a slowdown's is 1 - e^-L)."""
        return math.expm1(self.log_floor)


def gate_null(aa_deltas: list[float], *, per_gate_rate: float, rank: int, minimum: float, max_pairs: int,
              uncalibrated_floor: float) -> GateNull:
    n = len(aa_deltas)
    m = pairs_needed(n, rank, per_gate_rate, max_pairs)
    if m is None:
        # Not enough history for the target: a fixed floor, every pair must agree, no guarantee claimed.
        need = next(k for k in range(rank, 10**6) if pairs_needed(k, rank, per_gate_rate, max_pairs))
        return GateNull(math.log1p(uncalibrated_floor), max_pairs, False, n, None,
                        f"{n} A/A pair deltas for this gate on this host; {need} give the "
                        f"{per_gate_rate:.1e} per-gate bound with {max_pairs} pairs: run `tokengate calibrate`")
    floor = floor_from_history(aa_deltas, rank=rank, minimum=minimum)
    return GateNull(floor, m, True, n, false_significance_bound(n, rank, m))
