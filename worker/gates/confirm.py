"""Which gates a confirming process pair times.

A gate whose pairs so far missed its floor is decided (worker/gates/noise.py: the early stop is exact) and is not
timed again. When every gate still in play is slower and none is faster, the confirming pairs first time two
contexts at most: the shortest among those gates (the cheapest: on the 9B a confirming pair of every context took
~42 s, gpu-e2e-h200-20261206T231105Z.json) and the context of the gate furthest beyond its floor (the likeliest to
confirm). If one of them confirms, the model is significantly slower and the rest are reported as not confirmed
(likewise when a gate is already significantly slower and none faster: more pairs would change nothing). If none
does, the gates left out are timed after all, together, in fresh pairs until each is decided: a head slower on
purpose at a decoy gate, to steer which gates are confirmed, gains nothing, and no real regression is missed for the
saving.

So the model ends significantly slower, or faster, exactly when the full design (every gate in every pair) says so,
and every gate not reported as "not confirmed" gets the full design's decision (tests/worker/gates/test_confirm.py),
as long as a gate measures the same whichever other contexts its pair times: base and head time the same contexts in
the same order, so each pair delta compares like with like, and the placebo (worker/calibration/placebo.py
run_placebo, through `measure`) covers narrowed pairs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from worker.gates.bench import GateSpec
from worker.gates.noise import GateNull

WHY = ("slower in every pair timed, not confirmed: the confirming pairs timed {kept} (the shortest context and the "
       "gate furthest beyond its floor) and a confirmed slowdown there settles this model")
WHY_SETTLED = ("slower in every pair timed, not confirmed: {slower} is already significantly slower and no gate faster, "
               "so more pairs would change nothing")


@dataclass
class ConfirmPlan:
    timed: list[GateSpec]  # the gates the next confirming pair times (none: this model's measurement is done)
    # gates in play that the confirming pairs leave untimed for now -> why (timed after all if the kept gates
    # come to nothing; still here at the end: not confirmed)
    left_out: dict[str, str] = field(default_factory=dict)
    narrowed: bool = False  # a plan of this measurement has narrowed: it never narrows again


def confirming_gates(gates: list[GateSpec], deltas: dict[str, list[float]], nulls: dict[str, GateNull],
                     previous: ConfirmPlan | None = None) -> ConfirmPlan:
    """The gates another fresh pair should time, given each gate's pair deltas so far and the previous plan.

    At most 1 + 2 (m - 1) pairs for a largest per-gate design of m: the kept gates' and then, all together, the rest's."""
    left_out = dict(previous.left_out) if previous else {}
    narrowed = previous.narrowed if previous else False
    wanting = [g for g in gates if nulls[g.name].wants_more(deltas[g.name])]
    significant = {g.name: nulls[g.name].significant(deltas[g.name]) for g in gates}
    slower = [name for name, side in significant.items() if side < 0]
    faster = any(nulls[g.name].side(deltas[g.name]) > 0 for g in wanting) or any(s > 0 for s in significant.values())
    if slower and not faster:  # significantly slower already, nothing faster: more pairs would change nothing
        why = WHY_SETTLED.format(slower=", ".join(slower))
        left_out.update({g.name: why for g in wanting if g.name not in left_out})
        return ConfirmPlan([], left_out, narrowed)
    if left_out:
        kept = [g for g in wanting if g.name not in left_out]
        if kept:
            return ConfirmPlan(kept, left_out, True)
        # the kept gates came to nothing: the gates left out, all together (narrowing again could cost a round each)
        return ConfirmPlan([g for g in wanting if g.name in left_out], {}, True)
    if not wanting or faster or narrowed:
        return ConfirmPlan(wanting, {}, narrowed)

    def beyond(g: GateSpec) -> float:  # how far the least extreme pair lies past the floor, in floors (>= 1)
        return max(deltas[g.name]) / min(nulls[g.name].lo, -1e-12)

    keep = {min(g.context for g in wanting), max(wanting, key=beyond).context}
    timed = [g for g in wanting if g.context in keep]
    why = WHY.format(kept=", ".join(g.name for g in timed))
    return ConfirmPlan(timed, {g.name: why for g in wanting if g.context not in keep}, True)
