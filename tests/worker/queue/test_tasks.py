"""The Celery path end to end with the real Redis on this machine (dedicated db + key prefix)."""
import subprocess
import uuid

import pytest
import redis

from worker.queue.app import EVALUATE_TASK, app, configure
from worker.records import EvalResult, Verdict

from tests.worker.helpers import GOOD, fake_model, make_profile, make_repo, make_settings

REDIS_URL = "redis://127.0.0.1:6379/13"


def _redis_or_skip():
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")


@pytest.mark.sandbox
@pytest.mark.services
def test_evaluate_task_through_redis(tmp_path, cache, monkeypatch):
    _redis_or_skip()
    from celery.contrib.testing.worker import start_worker

    import worker.queue.tasks  # noqa: F401  (registers the task)

    prefix = f"tgtest-{uuid.uuid4().hex[:8]}:"
    configure(REDIS_URL, REDIS_URL, key_prefix=prefix)
    monkeypatch.setenv("TOKENGATE_TRUSTED_RUNTIME", str(GOOD))
    repo = make_repo(tmp_path, head="slow_decode")
    sha = lambda ref: subprocess.run(["git", "-C", str(repo), "rev-parse", ref], capture_output=True, text=True,
                                     check=True).stdout.strip()
    profile = make_profile(fake_model(tmp_path / "m.gguf"), pairs=3, inner=2, prompts_per_seed=1)
    profile = profile.model_copy(update={"models": [profile.models[0].model_copy(
        update={"decode_contexts": [32], "prefill_contexts": [64]})]})
    job = {"repo_url": str(repo), "repo_full_name": "acme/runtime", "pr_number": 7, "base_ref": "main",
           "base_sha": sha("main"), "head_sha": sha("pr"), "head_ref": "pr", "profile": "test",
           "models": ["fake"], "attempt": 1, "eval_id": 42, "settings": make_settings(profile).model_dump()}
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with start_worker(app, pool="solo", queues=["gpu"], perform_ping_check=False, shutdown_timeout=30):
            res = app.send_task(EVALUATE_TASK, args=[job], queue="gpu")
            out = res.get(timeout=120)
            # the worker signs with its own key when one is set (tests/bot's conftest sets one): the bot strips it
            from worker.queue.tasks import RESULT_AUTH
            r = EvalResult.from_dict({k: v for k, v in out.items() if k != RESULT_AUTH})
            assert r.verdict == Verdict.REJECT, r.summary
            assert r.head_sha == job["head_sha"] and r.pr_number == 7 and r.repo == "acme/runtime"
            assert any(g.regression and g.gate == "decode@32" for g in r.gates)
            # Same (repo, PR, head SHA, profile) again: the stored result, not a second measurement.
            again = app.send_task(EVALUATE_TASK, args=[{**job, "eval_id": 43}], queue="gpu").get(timeout=60)
            assert again["receipt"].get("reused_from_cache") is True
            assert again["receipt"]["eval_id"] == out["receipt"]["eval_id"]
        assert client.keys(f"{prefix}tokengate:result:*")
    finally:
        for k in client.scan_iter(f"{prefix}*"):
            client.delete(k)
        for k in client.scan_iter("*"):  # kombu's queue keys carry the prefix too; drop ours only
            if k.decode(errors="replace").startswith(prefix):
                client.delete(k)
