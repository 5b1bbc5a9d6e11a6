"""Dying like a host fault: the timed decode prints a CUDA out-of-memory error and a sandbox-looking line
to stderr and exits at once, hoping the text makes its crash INFRA (an OOM the box is too small for)."""
import os
import sys

from ._honest import causal_mask, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)


def decode_step(engine, t):
    print("torch.OutOfMemoryError: CUDA error: out of memory (tried to allocate 80.00 GiB)\n"
          "bwrap: sandbox setup failed: cgroup memory.max", file=sys.stderr, flush=True)
    os._exit(137)


def on_load():
    pass
