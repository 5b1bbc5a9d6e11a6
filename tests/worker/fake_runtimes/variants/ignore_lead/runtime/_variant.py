"""Fault-injection variant: the first decode after a prefill (the timed generate's secret lead token) is not
consumed, so generate_greedy continues from the prefill's argmax as before the lead existed, one decode step
cheaper. Prefill and the accuracy guard are untouched; only the teacher-forced check on [lead] + ids sees it."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    out = engine._block(ids)
    engine._fresh = True
    return out


def decode_step(engine, t):
    if getattr(engine, "_fresh", False):  # the lead: ignored, the prefill's logits stay the last ones
        engine._fresh = False
        return engine.last
    return engine._block([t])[0]


def emitted(ids):
    return ids


def on_load():
    pass
