"""Hostile head (a red-team finding, session 30): a REAL 2x decode slowdown at long context (position >= 150,
i.e. decode@160), and a decoy: decode at mid context (90..130, decode@96) does its work 6x, but only in a process
that has already run something at long context. In the first process pair (all contexts staged, warm-up and reps
interleave every context) the decoy is the gate furthest beyond its floor; a confirming pair narrowed to decode@96
(the shortest in play and the furthest) never sees a long context, so the decoy is not slow there and the real
regression would go unconfirmed unless the gates left out are timed after all (worker/gates/confirm.py).
A second model (E[0,0] < 0: fake_model seed 1) decodes plainly: against a `slow_decode_model_b` base it is 2x
faster, and a regression on the first beside a speedup on the second is MIXED, never a tier."""
from ._work import causal_mask, emitted, on_load, repeated  # noqa: F401

SEEN_LONG = False


def prefill_logits(engine, ids):
    global SEEN_LONG
    if engine.position + len(ids) >= 150:
        SEEN_LONG = True
    return engine._block(ids)


def decode_step(engine, t):
    global SEEN_LONG
    if engine.E[0, 0] < 0:  # the second model
        return engine._block([t])[0]
    times = 1
    if engine.position >= 150:
        SEEN_LONG, times = True, 2  # the real regression
    elif 90 <= engine.position < 130 and SEEN_LONG:
        times = 6  # the decoy
    return repeated(engine, [t], times)[0]
