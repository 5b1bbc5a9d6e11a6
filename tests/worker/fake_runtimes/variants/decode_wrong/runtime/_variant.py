"""Fault-injection variant: every 12th generated token is not the one decoded (a decode that goes wrong
now and then). Prefill and the accuracy guard are untouched and 11 of 12 tokens agree (above the 90 %
agreement bar); only the per-step token check, paired against base, sees it."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    return engine._block([t])[0]


def emitted(ids):
    return [(t + 1) % 1024 if i % 12 == 11 else t for i, t in enumerate(ids)]


def on_load():
    pass
