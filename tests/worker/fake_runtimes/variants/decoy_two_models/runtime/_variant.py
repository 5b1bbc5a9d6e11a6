"""`decoy` on model A; model B (E[0,0] < 0: fake_model seed 1) plain, so 2x faster than a `slow_decode_model_b`
base. A real regression on A beside a real speedup on B is MIXED, never a tier."""
import numpy as np

SEEN_LONG = False


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    global SEEN_LONG
    if engine.position + len(ids) >= 150:
        SEEN_LONG = True
    return engine._block(ids)


def decode_step(engine, t):
    global SEEN_LONG
    p = engine.position
    reps = 1
    if engine.E[0, 0] < 0:
        return engine._block([t])[0]
    if p >= 150:
        SEEN_LONG, reps = True, 2  # the real regression
    elif 90 <= p < 130 and SEEN_LONG:
        reps = 6  # the decoy
    for _ in range(reps - 1):
        engine._block([t])
        engine.position = p
    return engine._block([t])[0]


def emitted(ids):
    return ids


def on_load():
    pass
