"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, emitted, on_load, prefill_logits  # noqa: F401


def decode_step(engine, t):
    import time

    time.sleep(3600)
