"""Fault-injection variant: every 12th generated token is not the one decoded (a decode that goes wrong
now and then). Prefill and the accuracy guard are untouched and 11 of 12 tokens agree (above the 90 %
agreement bar); only the per-step token check, paired against base, sees it."""
from ._work import causal_mask, decode_step, on_load, prefill_logits  # noqa: F401


def emitted(ids):
    return [(t + 1) % 1024 if i % 12 == 11 else t for i, t in enumerate(ids)]
