"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    # Slow, and claims otherwise: time frozen in this process, fake results printed.
    import time

    time.perf_counter = time.monotonic = time.time = lambda: 0.0
    print('{"ok": true, "tok_s": 1000000, "elapsed": 1e-9}', flush=True)
    # A real 2x slowdown: the step's work is done twice (same result, same state).
    p = engine.position
    engine._block([t])
    engine.position = p
    return engine._block([t])[0]


def emitted(ids):
    return ids


def on_load():
    pass
