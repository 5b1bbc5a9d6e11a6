"""Compile caches kept per revision SHA, outside the sandbox's per-process scratch.

Without this every sandboxed process compiles every Triton kernel afresh (TRITON_CACHE_DIR
pointed into its own scratch, deleted with it). With it, the first process of a revision pays the
compile and every later process of the same SHA (the other side of an A/A, confirming pairs,
later evaluations) reads the cubins back.

A revision only ever reads and writes its own SHA's directory: the cache is written by revision
code, so a shared one would let a PR plant kernels that the base (or another PR) then loads.
The same SHA is the same code, so two processes of one SHA may share (Triton writes each entry
to a temporary name and renames it into place).

Revision code writes here, so it is capped: a process whose SHA's cache passes `MAX_BYTES_PER_REVISION`
is killed and the cache emptied (worker/sandbox/disk.py; the 9B's Triton cache is tens of MiB), and the
least recently used SHAs' caches are removed while all of them together pass `MAX_BYTES_TOTAL`.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from worker.paths import cache_dir
from worker.sandbox.disk import usage

MAX_BYTES_PER_REVISION = 4 << 30
MAX_ENTRIES_PER_REVISION = 100_000
MAX_BYTES_TOTAL = 32 << 30

_KEY = re.compile(r"^[0-9a-zA-Z][0-9a-zA-Z._-]{5,127}$")


def compile_cache_dir(key: str) -> Path:
    """The writable compile-cache directory of one revision (key: its commit SHA)."""
    if not _KEY.match(key or ""):
        raise ValueError(f"compile cache key {key!r} is not a commit SHA")
    d = cache_dir() / "compile" / key
    if not d.is_dir():  # a new SHA is what grows the total (each is capped): prune then, not on every process
        d.mkdir(parents=True, exist_ok=True)
        prune(d.parent, keep=d)
    os.utime(d)  # last used: what pruning goes by
    return d


def prune(root: Path, keep: Path, max_total: int | None = None) -> list[str]:
    """Remove the least recently used SHAs' caches (never `keep`) while all together pass `max_total`."""
    max_total = MAX_BYTES_TOTAL if max_total is None else max_total
    dirs = sorted((e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)),
                  key=lambda e: e.stat(follow_symlinks=False).st_mtime)
    sizes = {e.path: usage(Path(e.path), MAX_ENTRIES_PER_REVISION).bytes for e in dirs}
    total, removed = sum(sizes.values()), []
    for e in dirs:
        if total <= max_total:
            break
        if Path(e.path) != keep:
            shutil.rmtree(e.path, ignore_errors=True)
            total -= sizes[e.path]
            removed.append(e.name)
    return removed


def compile_cache_env(d: Path) -> dict[str, str]:
    """Environment that points the compilers' caches into `d` (overrides scrubbed_env's scratch paths)."""
    return {"TRITON_CACHE_DIR": str(d / "triton"), "CUDA_CACHE_PATH": str(d / "nv")}
