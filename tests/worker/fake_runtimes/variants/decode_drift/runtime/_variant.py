"""Fault-injection variant: every decode step's logits scaled by 0.7 (a temperature bug in the decode
path only). Greedy ids and the prefill logits are unchanged, so the token check, the prefill KL
check and the all-logits accuracy guard cannot see it; only the per-step KL of the timed decode can."""
from ._work import causal_mask, emitted, on_load, prefill_logits  # noqa: F401


def decode_step(engine, t):
    return engine._block([t])[0] * 0.7
