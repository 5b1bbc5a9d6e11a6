"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
import numpy as np

from ._work import decode_step, emitted, on_load, prefill_logits  # noqa: F401


def causal_mask(n, p):
    # Subtly wrong: the 8 most recent keys (self included) get a -0.6 bias, as a windowing bug would.
    m = np.triu(np.full((n, p + n), -np.inf), k=p + 1)
    rows = np.arange(n)[:, None] + p
    cols = np.arange(p + n)[None, :]
    return m + np.where((cols <= rows) & (cols > rows - 8), -0.6, 0.0)
