"""A cap on what a revision writes to host disk: its writable binds (its own SHA's compile cache).

No kernel limit fits: RLIMIT_FSIZE caps one file (1 GiB) but not how many, cgroup v2 has no disk
controller, and quotas need privileges the GPU worker does not have. So a watcher thread measures the
writable directories every `interval` seconds (allocated blocks and entries, never following a link,
stopping once past either cap) and kills the revision's process tree on a breach: what a revision can
leave on the host stays under the cap plus one interval's writes, and the parent wipes it after.
"""
from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DiskUsage:
    bytes: int
    entries: int


def usage(top: Path, max_entries: int) -> DiskUsage:
    """Allocated bytes and entries under `top`, links not followed; stops counting past `max_entries`
    (a revision that makes millions of empty files must not make the measuring slow)."""
    total, entries, stack = 0, 0, [str(top)]
    while stack and entries <= max_entries:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue  # removed meanwhile, or not a directory any more
        with it:
            for e in it:
                entries += 1
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                if entries > max_entries:
                    break
    return DiskUsage(total, entries)


def empty(dirs: list[Path]) -> None:
    """Remove everything inside `dirs` (the directories stay); rmtree never follows the revision's links."""
    for d in dirs:
        for entry in list(os.scandir(d)) if d.is_dir() else []:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass


class DiskWatch(threading.Thread):
    """Polls `dirs`; on the first breach records why in `.breach` and calls `on_breach` (kill the tree)."""

    def __init__(self, dirs: list[Path], max_bytes: int, max_entries: int, on_breach, interval: float = 0.5):
        super().__init__(daemon=True, name="disk-watch")
        self.dirs, self.max_bytes, self.max_entries = list(dirs), max_bytes, max_entries
        self.on_breach, self.interval = on_breach, interval
        self.breach: str | None = None
        self._halt = threading.Event()

    def check(self) -> str | None:
        for d in self.dirs:
            u = usage(d, self.max_entries)
            if u.bytes > self.max_bytes or u.entries > self.max_entries:
                return (f"wrote {u.bytes >> 20} MiB in {u.entries} entries to {d.name}, over its cap of "
                        f"{self.max_bytes >> 20} MiB / {self.max_entries} entries; killed")
        return None

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            why = self.check()
            if why is not None:
                self.breach = why
                self.on_breach()
                return

    def stop(self) -> str | None:
        """Stop polling; one last measurement (what it wrote since the last poll counts too)."""
        self._halt.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=5)
        if self.breach is None:
            self.breach = self.check()
        return self.breach
