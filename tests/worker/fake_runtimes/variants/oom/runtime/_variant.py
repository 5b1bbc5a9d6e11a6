"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
import numpy as np

from ._work import causal_mask, decode_step, emitted, prefill_logits  # noqa: F401


def on_load():
    # A real allocation far beyond the sandbox's memory limit.
    big = np.ones(1 << 38)
    return big
