"""Fault-injection variant: every logit scaled by 0.7 (a temperature bug). Every argmax is unchanged,
so top-1 and the output check cannot see it; only the KL to the reference, paired against base's, can."""
from ._work import causal_mask, emitted, on_load  # noqa: F401


def prefill_logits(engine, ids):
    return engine._block(ids) * 0.7


def decode_step(engine, t):
    return engine._block([t])[0] * 0.7
