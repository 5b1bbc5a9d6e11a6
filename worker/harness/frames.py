"""Length-prefixed JSON frames over pipes: 4-byte big-endian length, then that many bytes of UTF-8 JSON.

The parent reads the revision's answers with a size cap and a deadline; an oversized, truncated
or unparsable frame is a protocol fault, never a hang or an unbounded allocation.
"""
from __future__ import annotations

import json
import os
import selectors
import struct
import time

HEADER = struct.Struct(">I")
MAX_ANSWER_BYTES = 4 << 20  # largest answer a revision may send (ids of a long generate fit easily)


class FrameError(Exception):
    """kind: timeout | closed | oversized | unreadable"""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


def encode(obj) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return HEADER.pack(len(data)) + data


class FrameReader:
    """Reads frames from a non-blocking fd; `on_idle` runs every `idle_s` while waiting."""

    def __init__(self, fd: int, max_bytes: int = MAX_ANSWER_BYTES):
        self.fd, self.max_bytes = fd, max_bytes
        self.buf = bytearray()
        os.set_blocking(fd, False)

    def _fill(self, need: int, deadline: float, on_idle, idle_s: float) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.fd, selectors.EVENT_READ)
        try:
            while len(self.buf) < need:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FrameError("timeout", "no complete answer before the deadline")
                if sel.select(min(left, idle_s)):
                    try:
                        chunk = os.read(self.fd, min(1 << 20, max(need - len(self.buf), 1 << 16)))
                    except BlockingIOError:
                        continue
                    if not chunk:
                        raise FrameError("closed", "the channel closed")
                    self.buf += chunk
                elif on_idle is not None:
                    on_idle()
        finally:
            sel.close()

    def read(self, timeout: float, on_idle=None, idle_s: float = 0.5) -> dict:
        deadline = time.monotonic() + timeout
        self._fill(HEADER.size, deadline, on_idle, idle_s)
        (n,) = HEADER.unpack_from(self.buf)
        if n > self.max_bytes:
            raise FrameError("oversized", f"answer of {n} bytes announced (limit {self.max_bytes})")
        self._fill(HEADER.size + n, deadline, on_idle, idle_s)
        data = bytes(self.buf[HEADER.size:HEADER.size + n])
        del self.buf[:HEADER.size + n]
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise FrameError("unreadable", f"unparsable answer {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise FrameError("unreadable", f"answer is a {type(obj).__name__}, not an object")
        return obj
