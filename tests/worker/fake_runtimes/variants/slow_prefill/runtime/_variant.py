"""Fault-injection variant: prefill does its work twice (a real 2x prefill slowdown, same outputs);
decode is the good one. Against a slow_decode base: decode faster, prefill slower (a mixed PR)."""
from ._work import causal_mask, decode_step, emitted, on_load, repeated  # noqa: F401


def prefill_logits(engine, ids):
    return repeated(engine, ids)
