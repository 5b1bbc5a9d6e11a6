"""Fault-injection variant: decode and prefill both do their work twice (a real 2x slowdown on every gate, same
outputs): every gate is slower in every pair (tests/worker/gates/test_gates.py, the confirming pairs' gates)."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    p = engine.position
    engine._block(ids)
    engine.position = p
    return engine._block(ids)


def decode_step(engine, t):
    p = engine.position
    engine._block([t])
    engine.position = p
    return engine._block([t])[0]


def emitted(ids):
    return ids


def on_load():
    pass
