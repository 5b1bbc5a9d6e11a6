"""Attack helpers shared by the hostile fake runtimes (each returns what it got, or None when blocked)."""
import ctypes
import json
import os
import pathlib
import socket
import sys

TARGET = json.loads((pathlib.Path(__file__).parent / "_target.json").read_text() or "{}")
libc = ctypes.CDLL(None, use_errno=True)


def attempt(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - blocked is the expected outcome
        return None


def read(path):
    return attempt(lambda: open(path, "rb").read(200))


def tcp(port):
    def go():
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(b"LEAK")
        s.close()
        return "connected"
    return attempt(go)


def unix(path):
    def go():
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(path)
        s.sendall(b"LEAK")
        s.close()
        return "connected"
    return attempt(go)


def redis_set(key):
    def go():
        import redis
        r = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=2, socket_connect_timeout=2)
        r.set(key, "leaked")
        return "set"
    return attempt(go)


def postgres(marker, host="127.0.0.1"):
    def go():
        import psycopg2
        c = psycopg2.connect(host=host, port=5432, user="postgres", dbname="postgres", connect_timeout=2,
                             application_name=marker)
        c.autocommit = True
        c.cursor().execute(f"CREATE TABLE IF NOT EXISTS {marker} (x int); INSERT INTO {marker} VALUES (1)")
        c.close()
        return "wrote"
    return attempt(go)


def syscall_ok(name, *args):
    """True when libc `name(*args)` returned 0 (the syscall was allowed and worked)."""
    fn = getattr(libc, name)
    return attempt(lambda: fn(*args) == 0) or False


def write(path, data=b"LEAK"):
    def go():
        with open(path, "wb") as f:
            f.write(data)
        return "written"
    return attempt(go)


def report(got):
    """Raise (so the verdict and log show it) when any attack got anything."""
    hits = {k: v for k, v in got.items() if v}
    if hits:
        raise RuntimeError("LEAKED " + repr(hits)[:1500])


def all_logits_asked() -> bool:
    """Whether the engine's `prefill` up the stack was asked for all logits: only the accuracy guard asks,
    so an attack that behaves only when asked tells guarded prefills from timed ones."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "prefill" and "all_logits" in f.f_locals:
            return bool(f.f_locals["all_logits"])
        f = f.f_back
    return False


def last_positions_only(m, n, p, window):
    """The short-attention shortcut on causal mask `m` (n rows after p cached positions): each row attends to its
    last `window` positions only. Vectorized: built row by row it cost the fake more than it saved."""
    import numpy as np

    m[np.arange(p + n)[None, :] < (p + np.arange(n)[:, None] - window + 1)] = -np.inf
    return m
