"""Fault-injection variant: a main whose generate is broken (1 emitted token in 3 is not the decoded one), far below
the output check's agreement bar, while prefill and the accuracy guard are untouched. A PR on it that fixes the
generate must not be blamed: main failing its own bars is INFRA (red-team finding on skipped output checks)."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    return engine._block([t])[0]


def emitted(ids):
    return [(t + 1) % 1024 if i % 3 == 2 else t for i, t in enumerate(ids)]


def on_load():
    pass
