"""An honest model whose rewritten frame writer answers the worker's memory question without the memory: a
KeyError in the harness was INFRA (retried, never the PR's). The report is the revision's word (the memory gates
read NVML), kept only when it has a bounded shape."""
import sys

from ._honest import causal_mask, decode_step, emitted, on_load, prefill_logits  # noqa: F401  (hooks it keeps)

_main = sys.modules["__main__"]
_real_write = _main._write_frame


def _forged(fd, obj):
    if "memory" in obj and set(obj) <= {"ok", "memory", "seq", "seconds", "cpu_s"}:  # the answer to `memory`
        del obj["memory"]
    return _real_write(fd, obj)


_main._write_frame = _forged
