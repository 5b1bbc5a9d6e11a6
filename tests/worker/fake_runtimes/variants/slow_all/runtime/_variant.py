"""Fault-injection variant: decode and prefill both do their work twice (a real 2x slowdown on every gate, same
outputs): every gate is slower in every pair (tests/worker/gates/test_gates.py, the confirming pairs' gates)."""
from ._work import causal_mask, emitted, on_load, repeated  # noqa: F401


def prefill_logits(engine, ids):
    return repeated(engine, ids)


def decode_step(engine, t):
    return repeated(engine, [t])[0]
