"""Fault-injection variant of the fake runtime (see tests/worker/verdicts/test_faults.py)."""
from ._work import causal_mask, decode_step, emitted, on_load, prefill_logits  # noqa: F401


def _phone_home():
    import pathlib
    import socket

    port = int((pathlib.Path(__file__).parent / "_target.txt").read_text())
    s = socket.create_connection(("127.0.0.1", port), timeout=3)  # raises when there is no network
    s.sendall(b"LEAK")
    s.close()


_phone_home()
