"""Which gates a confirming process pair times.

A gate whose pairs so far missed its floor is decided (worker/gates/noise.py: the early stop is exact) and is not
timed again. When every gate still in play is slower and none is faster, the model's answer can only be "slower"
(REJECT, or MIXED beside another model's speedup) or "no significant change": the confirming pairs then time two
contexts at most, the shortest among those gates (the cheapest: on the 9B a confirming pair of every context took
~42 s, gpu-e2e-h200-20261206T231105Z.json) and the context of the gate furthest beyond its floor (the likeliest to
confirm, so a change seen only at long context is not traded for speed). The rest are reported as not confirmed.

Choosing them from the data keeps the bound: a kept gate that confirms under the null is a gate that would have
confirmed in the full design too (its pairs are the same draws), and the evaluation's bound already sums over every
gate. Base and head time the same contexts in the same order, so each kept gate's pair delta compares like with like.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from worker.gates.bench import GateSpec
from worker.gates.noise import GateNull


@dataclass
class ConfirmPlan:
    timed: list[GateSpec]  # the gates the next confirming pair times
    not_confirmed: list[str] = field(default_factory=list)  # gates in play that it stops timing
    why: str | None = None


def confirming_gates(gates: list[GateSpec], deltas: dict[str, list[float]], nulls: dict[str, GateNull],
                     dropped: set[str] = frozenset()) -> ConfirmPlan:
    """The gates another fresh pair should time (none: the measurement is done). `dropped`: gates an earlier
    plan stopped timing, out of play for good (their pairs stay short of the design's, so never significant); once
    a plan has narrowed, the gates it kept are timed to the end."""
    in_play = [g for g in gates if g.name not in dropped and nulls[g.name].wants_more(deltas[g.name])]
    sides = {g.name: nulls[g.name].side(deltas[g.name]) for g in gates}
    faster = any(sides[g.name] > 0 for g in in_play) or any(
        nulls[g.name].significant(deltas[g.name]) > 0 for g in gates)
    if not in_play or faster or dropped:
        return ConfirmPlan(in_play)

    def beyond(g: GateSpec) -> float:  # how far the least extreme pair lies past the floor, in floors (>= 1)
        return max(deltas[g.name]) / nulls[g.name].lo

    keep = {min(g.context for g in in_play), max(in_play, key=beyond).context}
    timed = [g for g in in_play if g.context in keep]
    why = (f"slower in every pair so far, not timed again: the confirming pairs time only "
           f"{', '.join(g.name for g in timed)} (the shortest context and the gate furthest beyond its floor), "
           "since with no gate faster no pass or tier is at stake")
    return ConfirmPlan(timed, [g.name for g in in_play if g.context not in keep], why)
