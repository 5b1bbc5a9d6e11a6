"""Which gates a confirming process pair times: never a decided gate; with every gate in play slower and none
faster, the shortest context and the gate furthest beyond its floor; a REJECT through them is one the full design
would have given too (so the false-significance bound stands)."""
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
    assert names(plan.timed) == ["decode@512", "prefill@32768"] and not plan.not_confirmed
    assert confirming_gates(GATES, {g.name: [0.0] for g in GATES}, nulls()).timed == []  # nothing left to confirm


def test_every_gate_slower_keeps_the_shortest_context_and_the_gate_furthest_beyond_its_floor():
    d = {g.name: [-0.05] for g in GATES}
    d["decode@32768"] = [-0.30]  # furthest beyond its floor: kept, with prefill@32768 (the same prefill)
    d["decode@512"] = [0.0]  # decided
    plan = confirming_gates(GATES, d, nulls())
    assert names(plan.timed) == ["decode@128", "decode@32768", "prefill@32768"]
    assert plan.not_confirmed == ["decode@4096", "prefill@4096"] and "decode@128" in plan.why
    # once dropped, out of play for good (its pairs stay short of the design), and the kept gates stay kept
    d["decode@32768"].append(-0.011)  # now the least extreme pair of decode@32768 is barely beyond its floor
    again = confirming_gates(GATES, d, nulls(), set(plan.not_confirmed))
    assert names(again.timed) == names(plan.timed) and again.not_confirmed == []
    # the least extreme pair decides how far a gate is beyond its floor
    d = {g.name: [-0.02, -0.02] for g in GATES}
    d["decode@32768"] = [-0.30, -0.011]
    d["decode@4096"] = [-0.05, -0.04]
    assert names(confirming_gates(GATES, d, nulls()).timed) == ["decode@128", "decode@4096", "prefill@4096"]


def test_a_gate_already_significantly_faster_keeps_every_slower_gate_in_play():
    n = nulls()
    n["decode@128"] = GateNull(-F, F, 1, True, 30, 1e-4)  # one pair suffices: already significant, faster
    d = {g.name: [-0.05] for g in GATES}
    d["decode@128"] = [0.05]
    plan = confirming_gates(GATES, d, n)
    assert names(plan.timed) == [g.name for g in GATES if g.name != "decode@128"] and not plan.not_confirmed


def test_a_narrowed_reject_is_one_the_full_design_gives_too():
    """A/A draws with every gate's pairs from one null, correlated across gates (a pair's offset): whenever the
    narrowed confirmation finds a gate significantly slower, the full design (every gate timed in every pair) does
    too, so narrowing cannot raise the false-REJECT rate. Drawn loose (floors near the spread) to have events."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(4000):
        n = nulls(pairs=3)
        full = rng.normal(0, 0.01, (3, 1)) + rng.normal(0, 0.006, (3, len(GATES)))  # 3 pairs x gates
        dropped: set[str] = set()
        d = {g.name: [full[0, i]] for i, g in enumerate(GATES)}
        for k in (1, 2):
            plan = confirming_gates(GATES, d, n, dropped)
            if not plan.timed:
                break
            dropped |= set(plan.not_confirmed)
            for g in plan.timed:
                d[g.name].append(full[k, GATES.index(g)])
        narrowed = any(n[g.name].significant(d[g.name]) < 0 for g in GATES)
        full_design = any(n[g.name].significant(list(full[:, i])) < 0 for i, g in enumerate(GATES))
        assert full_design or not narrowed
        hits += narrowed
    assert hits > 20  # the property was exercised
