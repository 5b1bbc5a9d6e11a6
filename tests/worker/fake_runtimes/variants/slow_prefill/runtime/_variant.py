"""Fault-injection variant: prefill does its work twice (a real 2x prefill slowdown, same outputs);
decode is the good one. Against a slow_decode base: decode faster, prefill slower (a mixed PR)."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    p = engine.position
    engine._block(ids)
    engine.position = p
    return engine._block(ids)


def decode_step(engine, t):
    return engine._block([t])[0]


def emitted(ids):
    return ids


def on_load():
    pass
