"""Fixtures for the worker tests (helpers that are not fixtures: tests/worker/helpers.py)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tgcache")
