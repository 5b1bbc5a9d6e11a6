"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
import numpy as np

from ._work import causal_mask, emitted, on_load  # noqa: F401


def prefill_logits(engine, ids):
    return engine._block(ids) * np.nan


def decode_step(engine, t):
    return engine._block([t])[0] * np.nan
