"""ordered_map: results in submission order, bounded bytes in flight, errors surface."""
import random
import threading
import time

import pytest

from runtime.synth.prefetch import ordered_map


def test_results_come_in_order_whatever_finishes_first():
    rng = random.Random(0)
    delays = [rng.random() * 0.01 for _ in range(40)]

    def work(i):
        time.sleep(delays[i])
        return i * i

    out = list(ordered_map(work, range(40), workers=4, cost=lambda i: 1, budget=100))
    assert out == [(i, i * i) for i in range(40)]


def test_budget_bounds_what_is_in_flight():
    lock, live, peak = threading.Lock(), [0], [0]

    def work(i):
        with lock:
            live[0] += 10
            peak[0] = max(peak[0], live[0])
        time.sleep(0.002)
        with lock:
            live[0] -= 10
        return i

    got = [i for i, _ in ordered_map(work, range(30), workers=8, cost=lambda i: 10, budget=25)]
    assert got == list(range(30)) and peak[0] <= 20


def test_a_job_larger_than_the_budget_still_runs_alone():
    assert [r for _, r in ordered_map(lambda i: i, [1, 2], workers=2, cost=lambda i: 100, budget=1)] == [1, 2]


def test_worker_errors_reach_the_consumer():
    def work(i):
        if i == 3:
            raise RuntimeError("boom")
        return i

    with pytest.raises(RuntimeError, match="boom"):
        list(ordered_map(work, range(10), workers=2, cost=lambda i: 1, budget=4))
    with pytest.raises(ValueError):
        list(ordered_map(work, range(3), workers=0, cost=lambda i: 1, budget=4))
