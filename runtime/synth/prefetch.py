"""Run jobs on a thread pool ahead of a consumer that takes the results in submission order.

The writer of a GGUF needs tensors in plan order, but making them is the slow part; this
lets `workers` threads make the next ones while the consumer handles the current one.
Memory stays bounded: a job is started only while the cost (bytes) of the jobs started and
not yet consumed stays within `budget` (a single job larger than the budget runs alone).

Jobs are started in order and the consumer waits only for the oldest one, so the budget can
never be held by later jobs while the oldest waits to start: no deadlock.  Threads, not
processes: the work is large torch ops that release the GIL, and results then need no copy
between processes.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    workers: int,
    cost: Callable[[T], int],
    budget: int,
    initializer: Callable[[], None] | None = None,
) -> Iterator[tuple[T, R]]:
    """Yield (item, fn(item)) in the order of `items`, computing up to `workers` ahead."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    todo = iter(items)
    nxt = next(todo, None)
    started: deque[tuple[T, int, Future]] = deque()
    held = 0
    pool = ThreadPoolExecutor(max_workers=workers, initializer=initializer, thread_name_prefix="synth")
    try:
        while True:
            # Keep the pool fed: a few more jobs than threads, so none idles between results.
            while nxt is not None and len(started) < 2 * workers and (not started or held + cost(nxt) <= budget):
                c = cost(nxt)
                started.append((nxt, c, pool.submit(fn, nxt)))
                held += c
                nxt = next(todo, None)
            if not started:
                return
            item, c, fut = started.popleft()
            result = fut.result()
            # Release the budget before handing the result over: the consumer drops it
            # before asking for the next one.
            held -= c
            yield item, result
    finally:
        for _, _, fut in started:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
