"""The decode profiler's per-step view: one step's kernels in launch order, totals per step by name."""
from bench.profiling.decode_profile import by_name, per_step


def _ks(names, steps):
    t, out = 0.0, []
    for _ in range(steps):
        for n, d in names:
            out.append((t, d, n))
            t += d + 1e-6
    return out


def test_one_step_is_the_last_steps_launch_sequence():
    seq = [("gemv", 2e-6), ("gdn", 5e-6), ("gemv", 3e-6)]
    rows = per_step(_ks(seq, 3), 3)
    assert [r["name"] for r in rows] == ["gemv", "gdn", "gemv"]
    assert [r["us"] for r in rows] == [2.0, 5.0, 3.0]


def test_a_count_that_is_not_a_whole_number_of_steps_gives_no_step():
    # a stray kernel (a warm-up's tail) would shift every row onto the wrong matrix
    assert per_step(_ks([("a", 1e-6)], 2) + [(9.0, 1e-6, "stray")], 2) == []


def test_totals_are_per_step_and_largest_first():
    rows = by_name(_ks([("gemv", 2e-6), ("gdn", 5e-6), ("gemv", 4e-6)], 2), 2)
    assert rows[0] == {"name": "gemv", "per_step": 2.0, "us_per_step": 6.0}
    assert rows[1]["name"] == "gdn" and rows[1]["us_per_step"] == 5.0
