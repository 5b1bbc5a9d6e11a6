"""Where the worker keeps its caches (synthetic models, pinned references, A/A records, clones)."""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """~/.cache/tokengate, or $TOKENGATE_CACHE_DIR (read when called, never at import)."""
    d = Path(os.environ.get("TOKENGATE_CACHE_DIR") or Path.home() / ".cache" / "tokengate")
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextmanager
def locked(path: Path):
    """An exclusive lock on `path` between processes of this box; the kernel drops it if the holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
