"""Logits move through shared memory the PARENT allocates (a sealed memfd), never through a file.

The parent creates the memfd, fixes its size and seals it (no grow, no shrink), and hands the fd
to the child at start. The child writes raw float32 rows at offset 0; the parent, after a valid
answer, copies `rows x vocab` values out of its own read-only mapping (size checked against the
capacity it chose) and does every reduction itself. Pages are only allocated when written, and
the child's writes are charged to the child's cgroup.
"""
from __future__ import annotations

import fcntl
import mmap
import os

import numpy as np

DEFAULT_CAPACITY = 4 << 30  # virtual size; only written pages cost memory

F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 0x1, 0x2, 0x4


class LogitsBuffer:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self.fd = os.memfd_create("tokengate-logits", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, capacity)
        fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
        self.view = mmap.mmap(self.fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ)

    def pinned_bytes(self, rows: int, vocab: int) -> int:
        """What the driver page-locks for `rows` x vocab float32 at offset 0 (driver.py pin_logits): page-rounded,
        at most the capacity. The parent's own figure, to check the driver's answer against."""
        return min(self.capacity, -(-rows * vocab * 4 // mmap.PAGESIZE) * mmap.PAGESIZE) if rows > 0 else 0

    def read(self, rows: int, vocab: int) -> np.ndarray:
        """A private copy of rows x vocab float32 values (ValueError if over capacity)."""
        if not (isinstance(rows, int) and isinstance(vocab, int)) or rows <= 0 or vocab <= 0:
            raise ValueError(f"bad logits shape {rows!r} x {vocab!r}")
        n = rows * vocab * 4
        if n > self.capacity:
            raise ValueError(f"{rows} x {vocab} logits exceed the shared buffer ({self.capacity} bytes)")
        return np.frombuffer(self.view, dtype=np.float32, count=rows * vocab).reshape(rows, vocab).copy()

    def close(self) -> None:
        try:
            self.view.close()
        except (BufferError, ValueError):
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
