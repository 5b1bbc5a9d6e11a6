"""Fault-injection variant: every logit scaled by 0.7 (a temperature bug). Every argmax is unchanged,
so top-1 and the output check cannot see it; only the KL to the reference, paired against base's, can."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids) * 0.7


def decode_step(engine, t):
    return engine._block([t])[0] * 0.7


def emitted(ids):
    return ids


def on_load():
    pass
