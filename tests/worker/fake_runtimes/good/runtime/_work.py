"""The good revision's pieces, for fault-injection variants to keep what they do not replace (a variant overlays
`_variant.py` only), and the one way a variant slows work down for real: doing it again."""
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
    pass


def repeated(engine, ids, times: int = 2):
    """`engine._block(ids)` done `times` times from the same position: a real slowdown, same result and state."""
    p = engine.position
    for _ in range(times - 1):
        engine._block(ids)
        engine.position = p
    return engine._block(ids)
