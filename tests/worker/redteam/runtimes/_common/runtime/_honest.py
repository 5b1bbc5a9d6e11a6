"""The honest hooks of the good fake runtime (tests/worker/fake_runtimes/good/runtime/_variant.py), for
hostile variants that attack elsewhere: each imports the ones it does not replace."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)

def prefill_logits(engine, ids):
    return engine._block(ids)

def decode_step(engine, t):
    return engine._block([t])[0]

def emitted(ids):
    return ids
