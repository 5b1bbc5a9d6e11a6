"""Hogging: after each answer, burn CPU on short-lived threads while the other revision is timed."""
import threading
import time

from ._honest import causal_mask, decode_step  # noqa: F401  (hooks it does not replace)


def prefill_logits(engine, ids):
    _hog()
    return engine._block(ids)


def _burn(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


def _hog():
    for _ in range(2):
        threading.Thread(target=_burn, args=(0.05,), daemon=True).start()


def emitted(ids):
    _hog()
    return ids


def on_load():
    pass
