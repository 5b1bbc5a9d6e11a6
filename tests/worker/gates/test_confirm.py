"""Which gates a confirming process pair times: never a decided gate; with every gate in play slower and none
faster, first the shortest context and the gate furthest beyond its floor, then, if neither confirms, the gates left
out, together; so the model ends slower or faster exactly when the full design says so, every gate not reported as
not confirmed gets the full design's decision, and the pairs stay within 1 + 2 (m - 1)."""
import numpy as np

from worker.gates.bench import GateSpec
from worker.gates.confirm import confirming_gates
from worker.gates.noise import GateNull

F = 0.01  # both floors at 1 %


def gate(metric: str, c: int) -> GateSpec:
    return GateSpec(f"{metric.split('_')[0]}@{c}", metric, c, 65 if metric == "decode_tok_s" else c)


GATES = [gate("decode_tok_s", c) for c in (128, 512, 4096, 32768)] + [gate("prefill_tok_s", c) for c in (4096, 32768)]


def nulls(pairs: int = 4) -> dict[str, GateNull]:
    return {g.name: GateNull(-F, F, pairs, True, 30, 1e-4) for g in GATES}


def names(gs) -> list[str]:
    return [g.name for g in gs]


def test_a_decided_gate_is_never_timed_again_and_a_possible_speedup_keeps_every_gate_in_play():
    d = {g.name: [0.0] for g in GATES}  # every gate missed its floor: decided
    d["decode@512"] = [0.05]  # faster: in play
    d["prefill@32768"] = [-0.05]  # slower: in play, and with a faster gate in play a tier or MIXED is at stake
    plan = confirming_gates(GATES, d, nulls())
    assert names(plan.timed) == ["decode@512", "prefill@32768"] and not plan.left_out
    assert confirming_gates(GATES, {g.name: [0.0] for g in GATES}, nulls()).timed == []  # nothing left to confirm


def test_every_gate_slower_keeps_the_shortest_context_and_the_gate_furthest_beyond_its_floor():
    d = {g.name: [-0.05] for g in GATES}
    d["decode@32768"] = [-0.30]  # furthest beyond its floor: kept, with prefill@32768 (the same prefill)
    d["decode@512"] = [0.0]  # decided
    plan = confirming_gates(GATES, d, nulls())
    assert names(plan.timed) == ["decode@128", "decode@32768", "prefill@32768"]
    assert sorted(plan.left_out) == ["decode@4096", "prefill@4096"]
    assert "decode@128" in plan.left_out["decode@4096"]
    # while a kept gate is in play the plan stands, even where another gate now looks furthest
    for g in plan.timed:
        d[g.name].append(-0.011)
    d["decode@32768"][-1] = -0.0101
    again = confirming_gates(GATES, d, nulls(), plan)
    assert names(again.timed) == names(plan.timed) and again.left_out == plan.left_out
    # the least extreme pair decides how far a gate is beyond its floor
    d = {g.name: [-0.02, -0.02] for g in GATES}
    d["decode@32768"] = [-0.30, -0.011]
    d["decode@4096"] = [-0.05, -0.04]
    assert names(confirming_gates(GATES, d, nulls()).timed) == ["decode@128", "decode@4096", "prefill@4096"]


def test_a_kept_gate_that_confirms_ends_the_model_and_kept_gates_that_miss_bring_the_rest_back():
    d = {g.name: [-0.05] for g in GATES}
    plan = confirming_gates(GATES, d, nulls(pairs=2))  # all alike: the shortest is also the first furthest
    assert names(plan.timed) == ["decode@128"] and len(plan.left_out) == 5
    confirmed = {**d, "decode@128": [-0.05, -0.05]}  # two of two pairs beyond the floor: significantly slower
    done = confirming_gates(GATES, confirmed, nulls(pairs=2), plan)
    assert done.timed == [] and done.left_out == plan.left_out  # the rest: not confirmed
    missed = {**d, "decode@128": [-0.05, 0.0]}  # the decoy's trick: slow in the first pair only
    back = confirming_gates(GATES, missed, nulls(pairs=2), plan)
    assert names(back.timed) == sorted(plan.left_out, key=names(GATES).index) and not back.left_out  # all of them
    again = confirming_gates(GATES, {**missed, "decode@512": [-0.05, -0.05]}, nulls(pairs=2), back)
    assert again.timed == [] and "decode@512" in again.left_out["decode@4096"]  # settled: no more pairs
    more = {**missed, **{g: [-0.05, -0.02] for g in ("decode@512", "decode@4096")}}
    more["decode@32768"] = [-0.05, 0.0]  # decided; the rest still in play after a miss: never narrowed again
    assert names(confirming_gates(GATES, more, nulls(pairs=3), back).timed) == [
        "decode@512", "decode@4096", "prefill@4096", "prefill@32768"]


def test_a_gate_already_significantly_slower_with_none_faster_ends_the_model():
    n = nulls()
    n["decode@512"] = GateNull(-F, F, 1, True, 30, 1e-4)  # one pair suffices: significantly slower already
    plan = confirming_gates(GATES, {g.name: [-0.05] for g in GATES}, n)
    assert plan.timed == [] and set(plan.left_out) == {g.name for g in GATES} - {"decode@512"}


def test_a_gate_already_significantly_faster_keeps_every_slower_gate_in_play():
    n = nulls()
    n["decode@128"] = GateNull(-F, F, 1, True, 30, 1e-4)  # one pair suffices: already significant, faster
    d = {g.name: [-0.05] for g in GATES}
    d["decode@128"] = [0.05]
    plan = confirming_gates(GATES, d, n)
    assert names(plan.timed) == [g.name for g in GATES if g.name != "decode@128"] and not plan.left_out


def test_the_narrowed_confirmation_decides_as_the_full_design_does():
    """A/A and planted draws, correlated across gates (a pair's offset), one gate's draws the same whichever
    gates its pair times: the model is significantly slower under the narrowed confirmation exactly when it is
    under the full design (every gate timed in every pair), so neither the false-REJECT rate nor the power moves.
    Drawn loose (floors near the spread) to have events of both kinds."""
    rng = np.random.default_rng(7)
    m, events = 3, {True: 0, False: 0}
    for trial in range(3000):
        n = nulls(pairs=m)
        shift = np.zeros(len(GATES))
        if trial % 2:  # a real slowdown at one random context (long-context-only regressions included)
            shift[rng.integers(len(GATES))] = -0.02
        draws = rng.normal(0, 0.01, (3 * m, 1)) + rng.normal(0, 0.006, (3 * m, len(GATES))) + shift
        used = {g.name: 0 for g in GATES}  # each gate's next draw (its own sequence of fresh pairs)

        def take(g):
            used[g.name] += 1
            return draws[used[g.name] - 1, GATES.index(g)]

        d = {g.name: [take(g)] for g in GATES}
        plan, pairs = None, 1
        while True:
            plan = confirming_gates(GATES, d, n, plan)
            if not plan.timed:
                break
            pairs += 1
            for g in plan.timed:
                d[g.name].append(take(g))
        assert pairs <= 1 + 2 * (m - 1), (trial, pairs)
        for g in GATES:  # every gate not reported as not confirmed: the full design's decision
            if plan is None or g.name not in plan.left_out:
                assert n[g.name].significant(d[g.name]) == n[g.name].significant(
                    _full_design_deltas(n[g.name], draws[:, GATES.index(g)])), (trial, g.name, d)
        narrowed = any(n[g.name].significant(d[g.name]) < 0 for g in GATES)
        full = any(n[g.name].significant(_full_design_deltas(n[g.name], draws[:, i])) < 0 for i, g in enumerate(GATES))
        assert narrowed == full, (trial, d)
        events[narrowed] += 1
    assert min(events.values()) > 100  # both outcomes exercised


def _full_design_deltas(null: GateNull, column) -> list[float]:
    """A gate's deltas under the full design: its draws in order until it is decided."""
    out = []
    for x in column:
        out.append(x)
        if not null.wants_more(out):
            break
    return out
