"""Base for the two-model decoy case (tests/worker/gates/test_gates.py): decode twice as slow on model B only
(E[0,0] < 0: fake_model seed 1)."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    if engine.E[0, 0] < 0:
        p = engine.position
        engine._block([t])
        engine.position = p
    return engine._block([t])[0]


def emitted(ids):
    return ids


def on_load():
    pass
