"""Blaming the host: the timed decode raises, and the patched driver labels the failure a sandbox fault
(a kind only the worker may decide), with host-looking text, to get INFRA (retried, never the PR's) for
its own crash."""
import sys

import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    raise RuntimeError("bwrap: cannot freeze cgroup /sys/fs/cgroup/tokengate: Device or resource busy")


def emitted(ids):
    return ids


def on_load():
    sys.modules["__main__"]._classify = lambda exc: "sandbox"
