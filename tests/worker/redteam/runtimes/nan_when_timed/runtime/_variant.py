"""Non-finite logits only where they are timed: a prefill not asked for all logits (every timed prefill)
returns NaN; the accuracy guard's all-logits prefill is clean. The revision's own defect, so it must be
the PR's verdict, not a metric the host failed to produce (INFRA nan_metric, retried, before)."""
import numpy as np

from ._attacks import all_logits_asked
from ._honest import causal_mask, decode_step, emitted  # noqa: F401  (hooks it does not replace)


def prefill_logits(engine, ids):
    out = engine._block(ids)
    return out if all_logits_asked() else out * np.nan


def on_load():
    pass
