"""The pieces fault-injection revisions replace (the good revision's versions)."""
from ._work import causal_mask, decode_step, emitted, on_load, prefill_logits  # noqa: F401
