"""Compile caches kept per revision SHA, outside the sandbox's per-process scratch.

Without this every sandboxed process compiles every Triton kernel afresh (TRITON_CACHE_DIR
pointed into its own scratch, deleted with it). With it, the first process of a revision pays the
compile and every later process of the same SHA (the other side of an A/A, confirming pairs,
later evaluations) reads the cubins back.

A revision only ever reads and writes its own SHA's directory: the cache is written by revision
code, so a shared one would let a PR plant kernels that the base (or another PR) then loads.
The same SHA is the same code, so two processes of one SHA may share (Triton writes each entry
to a temporary name and renames it into place).
"""
from __future__ import annotations

import re
from pathlib import Path

from worker.paths import cache_dir

_KEY = re.compile(r"^[0-9a-zA-Z][0-9a-zA-Z._-]{5,127}$")


def compile_cache_dir(key: str) -> Path:
    """The writable compile-cache directory of one revision (key: its commit SHA)."""
    if not _KEY.match(key or ""):
        raise ValueError(f"compile cache key {key!r} is not a commit SHA")
    d = cache_dir() / "compile" / key
    d.mkdir(parents=True, exist_ok=True)
    return d


def compile_cache_env(d: Path) -> dict[str, str]:
    """Environment that points the compilers' caches into `d` (overrides scrubbed_env's scratch paths)."""
    return {"TRITON_CACHE_DIR": str(d / "triton"), "CUDA_CACHE_PATH": str(d / "nv")}
