"""Fault-injection variant: every decode step's logits scaled by 0.7 (a temperature bug in the decode
path only). Greedy ids and the prefill logits are unchanged, so the token check, the prefill KL
check and the all-logits accuracy guard cannot see it; only the per-step KL of the timed decode can."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    return engine._block([t])[0] * 0.7


def emitted(ids):
    return ids


def on_load():
    pass
