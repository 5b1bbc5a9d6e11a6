"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    # Writes a forged answer straight into the harness's channel (fd from the driver's argv).
    import json
    import os
    import sys

    os.write(int(sys.argv[2]), (json.dumps({"ok": True, "ids": [0] * 4}) + "\n").encode())
    return engine._block([t])[0]


def emitted(ids):
    return ids


def on_load():
    pass
