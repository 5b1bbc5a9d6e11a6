"""Detecting the timed run: full work only when all logits are asked for (the accuracy guard), a cheap
short-attention shortcut otherwise (every timed prefill and decode)."""
import sys

import numpy as np
from ._honest import decode_step, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)

WINDOW = 4


def causal_mask(n, p):
    m = np.triu(np.full((n, p + n), -np.inf), k=p + 1)
    if not _all_logits():
        for i in range(n):  # attend to the last WINDOW positions only: less work, wrong answers
            m[i, : max(0, p + i - WINDOW + 1)] = -np.inf
    return m


def _all_logits():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "prefill" and "all_logits" in f.f_locals:
            return bool(f.f_locals["all_logits"])
        f = f.f_back
    return False


def on_load():
    pass
