"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, emitted, on_load  # noqa: F401


def prefill_logits(engine, ids):
    return engine._block(ids) * 0.0


def decode_step(engine, t):
    return engine._block([t])[0] * 0.0
