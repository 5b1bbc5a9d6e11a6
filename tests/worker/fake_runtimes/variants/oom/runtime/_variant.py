"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    return engine._block([t])[0]


def emitted(ids):
    return ids


def on_load():
    # A real allocation far beyond the sandbox's memory limit.
    big = np.ones(1 << 38)
    return big
