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


def _job(tmp_path, monkeypatch, head: str, **settings) -> tuple[dict, str]:
    """A job for the fake runtimes' repository (head = a variant) and the Redis key prefix it is sent under."""
    _redis_or_skip()
    import worker.queue.tasks  # noqa: F401  (registers the task)

    prefix = f"tgtest-{uuid.uuid4().hex[:8]}:"
    configure(REDIS_URL, REDIS_URL, key_prefix=prefix)
    monkeypatch.setenv("TOKENGATE_TRUSTED_RUNTIME", str(GOOD))
    repo = make_repo(tmp_path, head=head)
    sha = lambda ref: subprocess.run(["git", "-C", str(repo), "rev-parse", ref], capture_output=True, text=True,
                                     check=True).stdout.strip()
    profile = make_profile(fake_model(tmp_path / "m.gguf"), pairs=3, inner=2, prompts_per_seed=1)
    profile = profile.model_copy(update={"models": [profile.models[0].model_copy(
        update={"decode_contexts": [32], "prefill_contexts": [64]})]})
    job = {"repo_url": str(repo), "repo_full_name": "acme/runtime", "pr_number": 7, "base_ref": "main",
           "base_sha": sha("main"), "head_sha": sha("pr"), "head_ref": "pr", "profile": "test",
           "models": ["fake"], "attempt": 1, "eval_id": 42, "settings": make_settings(profile, **settings).model_dump()}
    return job, prefix


def _drop_keys(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    for k in client.scan_iter(f"{prefix}*"):
        client.delete(k)
    for k in client.scan_iter("*"):  # kombu's queue keys carry the prefix too; drop ours only
        if k.decode(errors="replace").startswith(prefix):
            client.delete(k)


@pytest.mark.sandbox
@pytest.mark.services
def test_evaluate_task_through_redis(tmp_path, cache, monkeypatch):
    from celery.contrib.testing.worker import start_worker

    job, prefix = _job(tmp_path, monkeypatch, "slow_decode")
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
        _drop_keys(prefix)


@pytest.mark.sandbox
@pytest.mark.services
def test_the_verdict_is_out_before_the_sentinel_pair_runs(tmp_path, cache, monkeypatch):
    """The A/A sentinel pair is upkeep, not part of the verdict: the task's result is stored (and its link sent)
    before the worker takes the pair, and the pair is still recorded before the worker takes another job."""
    import threading

    from celery.contrib.testing.worker import start_worker

    from worker.calibration import sentinel

    job, prefix = _job(tmp_path, monkeypatch, "slow_decode", sentinel_aa_pair="always")
    sent, seen, done, record = [], {}, threading.Event(), sentinel.record_owed

    def spy(ev):
        seen["state_at_start"] = app.AsyncResult(sent[0]).state
        try:
            seen["report"] = record(ev)
        finally:
            done.set()

    monkeypatch.setattr(sentinel, "record_owed", spy)
    try:
        with start_worker(app, pool="solo", queues=["gpu"], perform_ping_check=False, shutdown_timeout=30):
            res = app.send_task(EVALUATE_TASK, args=[job], queue="gpu")
            sent.append(res.id)
            out = res.get(timeout=120)
            assert out["verdict"] == Verdict.REJECT.value, out["summary"]
            assert out["receipt"]["models"]["fake"]["sentinel_aa_pair"] == {"recorded": None,
                                                                            "note": sentinel.OWED_NOTE}
            assert done.wait(120), "the owed sentinel pair never ran"
        assert seen["state_at_start"] == "SUCCESS", seen
        assert seen["report"]["fake"]["recorded"] is True, seen
        assert set(seen["report"]["fake"]["deltas"]) == {"decode@32", "prefill@64"}
        assert [p["phase"] for p in seen["report"]["phases"]] == ["sentinel"], seen["report"]["phases"]
    finally:
        _drop_keys(prefix)



@pytest.mark.sandbox
@pytest.mark.services
def test_a_delivery_after_the_verdict_is_out_returns_it_and_measures_nothing(tmp_path, cache, monkeypatch):
    """The late ack comes after the upkeep: a worker lost there gets the message back. The verdict was stored; a second
    delivery returns it instead of measuring again (an INFRA one is never cached by key, so it would run twice)."""
    import threading

    from celery.contrib.testing.worker import start_worker
    from celery.signals import task_postrun

    from worker.queue import tasks

    job, prefix = _job(tmp_path, monkeypatch, "slow_decode")
    returned, second_done, measured = [], threading.Event(), []

    def on_postrun(task_id=None, retval=None, **_):
        returned.append(retval)
        if len(returned) == 2:
            second_done.set()

    task_postrun.connect(on_postrun, weak=False)
    try:
        with start_worker(app, pool="solo", queues=["gpu"], perform_ping_check=False, shutdown_timeout=30):
            first = app.send_task(EVALUATE_TASK, args=[job], queue="gpu")
            out = first.get(timeout=120)
            monkeypatch.setattr(tasks, "run_job", lambda *a, **k: measured.append(a) or {})
            app.send_task(EVALUATE_TASK, args=[job], queue="gpu", task_id=first.id)  # what a redelivery is
            assert second_done.wait(60), returned
        assert not measured and returned[1] == out
    finally:
        task_postrun.disconnect(on_postrun)
        _drop_keys(prefix)
