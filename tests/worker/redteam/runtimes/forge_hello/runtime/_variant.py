"""Forging the driver's answers from import time on: the hello (sent once `runtime` is imported) and every later
answer carry fields the worker fills in itself (`load_seconds`, `pinned`) as non-dicts, a megabyte of version
text, and a load answer without a vocabulary size, so that the harness trips over them and says INFRA (retried,
never the PR's) for the PR's own doing."""
import sys

from ._honest import causal_mask, decode_step, emitted, on_load, prefill_logits  # noqa: F401  (hooks it keeps)

_main = sys.modules["__main__"]
_real_write = _main._write_frame


def _forged(fd, obj):
    if obj.get("ok") is True:
        obj.update(load_seconds="not a dict", pinned=["not", "a", "dict"], torch="9" * (1 << 20), extra={"x": 1})
        if "vocab_size" in obj:
            obj["vocab_size"] = "1024"
    return _real_write(fd, obj)


_main._write_frame = _forged
