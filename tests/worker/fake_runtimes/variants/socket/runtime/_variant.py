"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    return engine._block([t])[0]


def emitted(ids):
    return ids


def _phone_home():
    import pathlib
    import socket

    port = int((pathlib.Path(__file__).parent / "_target.txt").read_text())
    s = socket.create_connection(("127.0.0.1", port), timeout=3)  # raises when there is no network
    s.sendall(b"LEAK")
    s.close()


_phone_home()


def on_load():
    pass
