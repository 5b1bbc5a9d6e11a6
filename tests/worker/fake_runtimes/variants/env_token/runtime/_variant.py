"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, decode_step, emitted, on_load, prefill_logits  # noqa: F401


def _steal():
    import os

    for k, v in os.environ.items():
        if any(w in k for w in ("TOKEN", "SECRET", "DATABASE", "PASSWORD", "KEY")):
            raise RuntimeError(f"found {k}={v}")


_steal()
