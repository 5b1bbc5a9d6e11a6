"""Cheating on some reps only: the first timed prefill of the prefill gate's length is honest, every later one
takes the short-attention shortcut. Only some reps' decode outputs are verified; every timed prefill must be."""
import numpy as np

from ._attacks import all_logits_asked, last_positions_only
from ._honest import decode_step, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)

WINDOW = 4
GATE_LENGTH = 64  # the prefill gate's context in the red-team profile (tests/worker/redteam/conftest.py)
_seen = []


def causal_mask(n, p):
    m = np.triu(np.full((n, p + n), -np.inf), k=p + 1)
    if p == 0 and n == GATE_LENGTH and not all_logits_asked():
        _seen.append(n)
        if len(_seen) > 1:  # rep 0 honest, reps 1.. cheap and wrong
            # (a head significantly slower on its only gate is checked on the verified rep alone, REJECT anyway:
            # the shortcut must not cost the fake time, see last_positions_only)
            last_positions_only(m, n, p, WINDOW)
    return m


def on_load():
    pass
