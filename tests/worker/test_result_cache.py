"""The GPU side's result cache takes back only entries this worker sealed with its own key: every GPU
worker's broker user may write the cache keys, and a verdict another worker planted there would otherwise
be signed by this one and accepted by the bot (real Redis, dedicated db and prefix)."""
from __future__ import annotations

import json

import pytest

from tests.services import redis_namespace
from worker.queue import auth, tasks


@pytest.fixture
def store(monkeypatch):
    with redis_namespace("cache") as (_, client, prefix):
        monkeypatch.setattr(tasks, "_redis", lambda: (client, prefix))
        monkeypatch.setenv("TOKENGATE_WORKER_ID", "gpu0")
        monkeypatch.setenv("TOKENGATE_WORKER_KEY", "gpu0-key")
        yield client, prefix


@pytest.mark.services
def test_a_worker_reuses_only_the_results_it_sealed(store, monkeypatch):
    client, prefix = store
    result = {"verdict": "XL", "head_sha": "a" * 40, "speedup": 1.45}
    tasks.store_result("k1", result)
    assert tasks.cached_result("k1") == result  # its own entry
    # Another GPU worker (its own key) plants a verdict under the same cache key ...
    monkeypatch.setenv("TOKENGATE_WORKER_ID", "gpu1")
    monkeypatch.setenv("TOKENGATE_WORKER_KEY", "gpu1-key")
    tasks.store_result("k2", {"verdict": "XL", "head_sha": "b" * 40})
    client.set(f"{prefix}tokengate:result:k3", json.dumps({"verdict": "XL"}))  # or a bare, unsealed one
    forged = auth.seal_cached("k1", {"verdict": "XL", "head_sha": "c" * 40})
    monkeypatch.setenv("TOKENGATE_WORKER_ID", "gpu0")
    monkeypatch.setenv("TOKENGATE_WORKER_KEY", "gpu0-key")
    assert tasks.cached_result("k2") is None and tasks.cached_result("k3") is None
    # ... or claims to be gpu0 without its key, or moves gpu0's sealed entry under another cache key.
    client.set(f"{prefix}tokengate:result:k1", json.dumps({**forged, "worker": "gpu0"}))
    assert tasks.cached_result("k1") is None
    tasks.store_result("k4", result)
    client.set(f"{prefix}tokengate:result:k5", client.get(f"{prefix}tokengate:result:k4"))
    assert tasks.cached_result("k5") is None and tasks.cached_result("k4") == result
