"""Where the worker keeps its caches (synthetic models, pinned references, A/A records, clones)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """~/.cache/tokengate, or $TOKENGATE_CACHE_DIR (read when called, never at import)."""
    d = Path(os.environ.get("TOKENGATE_CACHE_DIR") or Path.home() / ".cache" / "tokengate")
    d.mkdir(parents=True, exist_ok=True)
    return d
