"""Helpers for tests that talk to the real services on 127.0.0.1 (`.ci/run` starts them)."""
from __future__ import annotations

import secrets
from contextlib import contextmanager

import pytest

REDIS = "redis://127.0.0.1:6379"


@contextmanager
def redis_namespace(tag: str, db: int = 13):
    """(url, client, prefix): a key prefix of this test's own on the real Redis, every key under it deleted
    afterwards; the test skips where Redis does not answer."""
    import redis

    url = f"{REDIS}/{db}"
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"Redis on 127.0.0.1:6379 is not reachable: {exc}")
    prefix = f"tokengate-{tag}-{secrets.token_hex(4)}:"
    try:
        yield url, client, prefix
    finally:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
