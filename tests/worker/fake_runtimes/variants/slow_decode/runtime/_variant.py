"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, emitted, on_load, prefill_logits, repeated  # noqa: F401


def decode_step(engine, t):
    # A real 2x slowdown: the step's work is done twice (same result, same state).
    return repeated(engine, [t])[0]
