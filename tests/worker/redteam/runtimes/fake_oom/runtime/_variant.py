"""Dying like a host fault: the timed decode prints a CUDA out-of-memory error and a sandbox-looking line
to stderr and exits at once, hoping the text makes its crash INFRA (an OOM the box is too small for)."""
import os
import sys

import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    print("torch.OutOfMemoryError: CUDA error: out of memory (tried to allocate 80.00 GiB)\n"
          "bwrap: sandbox setup failed: cgroup memory.max", file=sys.stderr, flush=True)
    os._exit(137)


def emitted(ids):
    return ids


def on_load():
    pass
