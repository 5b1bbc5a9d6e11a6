"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, emitted, on_load, prefill_logits, repeated  # noqa: F401


def decode_step(engine, t):
    # Slow, and claims otherwise: time frozen in this process, fake results printed.
    import time

    time.perf_counter = time.monotonic = time.time = lambda: 0.0
    print('{"ok": true, "tok_s": 1000000, "elapsed": 1e-9}', flush=True)
    # A real 2x slowdown: the step's work is done twice (same result, same state).
    return repeated(engine, [t])[0]
