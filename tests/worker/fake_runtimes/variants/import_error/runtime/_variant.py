"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, decode_step, emitted, on_load, prefill_logits  # noqa: F401
import does_not_exist_tokengate  # noqa: F401  (a broken import: the PR does not build)
