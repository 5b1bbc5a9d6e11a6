"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, emitted, on_load, prefill_logits  # noqa: F401


def decode_step(engine, t):
    # Writes a forged answer straight into the harness's channel (fd from the driver's argv).
    import json
    import os
    import sys

    os.write(int(sys.argv[2]), (json.dumps({"ok": True, "ids": [0] * 4}) + "\n").encode())
    return engine._block([t])[0]
