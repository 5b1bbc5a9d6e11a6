"""Non-finite logits only where they are timed: a prefill not asked for all logits (every timed prefill)
returns NaN; the accuracy guard's all-logits prefill is clean. The revision's own defect, so it must be
the PR's verdict, not a metric the host failed to produce (INFRA nan_metric, retried, before)."""
import sys

import numpy as np
from ._honest import causal_mask, decode_step, emitted  # noqa: F401  (hooks it does not replace)


def _all_logits():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "prefill" and "all_logits" in f.f_locals:
            return bool(f.f_locals["all_logits"])
        f = f.f_back
    return False


def prefill_logits(engine, ids):
    out = engine._block(ids)
    return out if _all_logits() else out * np.nan


def on_load():
    pass
