"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, decode_step, on_load, prefill_logits  # noqa: F401


def emitted(ids):
    return ids[:-1]  # one id short: breaks the protocol
