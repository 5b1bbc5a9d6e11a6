"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, decode_step, emitted, prefill_logits  # noqa: F401


def on_load():
    raise RuntimeError("failed to map tensor blk.3.attn_qkv.weight: unexpected type 99")
