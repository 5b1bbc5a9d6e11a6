"""Fault-injection variant: a main whose generate is broken (1 emitted token in 3 is not the decoded one), far below
the output check's agreement bar, while prefill and the accuracy guard are untouched. A PR on it that fixes the
generate must not be blamed: main failing its own bars is INFRA (red-team finding on skipped output checks)."""
from ._work import causal_mask, decode_step, on_load, prefill_logits  # noqa: F401


def emitted(ids):
    return [(t + 1) % 1024 if i % 3 == 2 else t for i, t in enumerate(ids)]
