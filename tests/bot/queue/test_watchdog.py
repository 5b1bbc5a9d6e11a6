"""The watchdog: evaluations whose task vanished or is overdue become INFRA and are retried per settings.

Real PostgreSQL, real Redis (the queue lists, heartbeat keys and result backend the watchdog reads),
our GitHub server. No worker consumes the queue here (a Celery app of its own, on a key prefix of its
own), so each test decides what the task is doing: waiting, beating, finished, or gone.
"""
from __future__ import annotations

import json
import secrets
import time
from datetime import timedelta

import pytest
from celery import Celery
from kombu import Exchange, Queue

from bot.queue import watchdog
from bot.db.engine import session_scope
from bot.enums import EvalState, InfraReason, WatchdogAction
from bot.handlers import Handlers
from bot.db.models import Evaluation, utcnow
from bot.service import Service
from tests.bot.conftest import REDIS, pr_payload
from tests.bot.helpers import evaluations
from worker.queue import heartbeat
from worker.queue.app import GPU_QUEUE, PUBLISH_QUEUE
from worker.records import InfraKind

pytestmark = pytest.mark.services


@pytest.fixture
def quiet_celery():
    """A Celery app on its own key prefix that nothing consumes; its keys are deleted afterwards."""
    import redis
    url = f"{REDIS}/13"
    prefix = f"tokengate-wd-{secrets.token_hex(4)}:"
    app = Celery("watchdog-test", set_as_current=False)
    opts = {"global_keyprefix": prefix}
    app.conf.update(broker_url=url, result_backend=url, broker_transport_options=opts,
                    result_backend_transport_options=opts, task_serializer="json", result_serializer="json",
                    accept_content=["json"],
                    task_queues=tuple(Queue(q, Exchange(q), routing_key=q) for q in (GPU_QUEUE, PUBLISH_QUEUE)))
    client = redis.Redis.from_url(url)
    yield app, client, prefix
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)
    app.close()


@pytest.fixture
def service(settings, quiet_celery):
    return Service(settings, celery=quiet_celery[0])


def open_pr(service, github, remote, message: str = "speed up decode (xl)") -> Evaluation:
    remote.commit("changes", message)
    with session_scope() as s:
        Handlers(service).dispatch(s, "pull_request", pr_payload(github, remote, "opened"))
    (ev,) = evaluations()
    assert ev.state is EvalState.QUEUED
    return ev


def find(service, probe, after_s: float) -> list[watchdog.Finding]:
    with session_scope() as s:
        return watchdog.inspect_active(s, service.settings, probe, now=utcnow() + timedelta(seconds=after_s))


def act(service, finding) -> str:
    with session_scope() as s:
        return watchdog.act(s, service, finding)


def start(service, ev: Evaluation, host: str = "gpu0@box") -> None:
    from worker.queue.auth import sign_claim  # the test worker's own key (conftest's environment)
    with session_scope() as s:
        assert "running" in service.evaluation_started(s, ev.id, host, ev.celery_task_id,
                                                       sign_claim(ev.id, ev.celery_task_id))


def test_lost_message_then_lost_worker_retries_then_gives_up(service, quiet_celery, github, remote):
    app, client, prefix = quiet_celery
    probe = watchdog.TaskProbe(app, service.settings.worker_keys)
    grace = service.settings.watchdog_lost_after_s
    repo = github.repos["codertocat/hello-world"]
    ev = open_pr(service, github, remote)
    queue_key = f"{prefix}{GPU_QUEUE}"
    assert probe.in_broker(ev.celery_task_id) and client.llen(queue_key) == 1

    # Waiting in the queue is not lost, however long (up to the queue deadline).
    assert find(service, probe, grace + 60) == []
    # The message vanishes (Redis lost it, someone purged the queue): lost once the grace period is over.
    client.delete(queue_key)
    assert find(service, probe, grace - 5) == []
    (f,) = find(service, probe, grace + 1)
    assert (f.action, f.reason, f.kind) == (WatchdogAction.LOST, InfraReason.MESSAGE_LOST, InfraKind.WORKER_LOST)
    assert "retry 2/2" in act(service, f)

    (retry,) = evaluations()
    assert (retry.state, retry.attempt, retry.infra_kind) == (EvalState.QUEUED, 2, "worker_lost")
    assert retry.celery_task_id != ev.celery_task_id and probe.in_broker(retry.celery_task_id)
    first_run = github.check_runs[ev.check_run_id]
    assert (first_run["status"], first_run["conclusion"]) == ("completed", "action_required")
    assert repo.pulls[2].labels == ["eval:INFRA"]
    (comment,) = github.comments_on(repo, 2)
    assert "disappeared from the queue" in comment["body"] and "Retrying automatically" in comment["body"]

    # The retry starts and beats: alive, whatever the clock says (below the run deadline).
    start(service, retry)
    beat = heartbeat.Heartbeat(client, prefix, retry.celery_task_id,
                                 heartbeat.signed_value(retry.celery_task_id, "gpu0@box"), interval=0.2).start()
    try:
        assert find(service, probe, grace + 600) == []
    finally:
        beat.stop()
    # The worker vanished: no heartbeat → INFRA; this was the last attempt, so it stays INFRA.
    assert find(service, probe, grace - 5) == []
    (f,) = find(service, probe, grace + 1)
    assert (f.reason, f.kind) == (InfraReason.WORKER_LOST, InfraKind.WORKER_LOST)
    assert "INFRA" in act(service, f)
    (final,) = evaluations()
    assert (final.state, final.verdict, final.attempt) == (EvalState.INFRA, "INFRA", 2)
    run = github.check_runs[final.check_run_id]
    assert (run["conclusion"], run["actions"][0]["identifier"]) == ("action_required", "rerun")
    assert repo.pulls[2].labels == ["eval:INFRA"]  # never REJECT
    (comment,) = github.comments_on(repo, 2)
    assert "stopped responding (gpu0@box)" in comment["body"] and "Gave up after 2 attempts" in comment["body"]
    assert find(service, probe, 10 * grace) == []  # nothing active any more
    # A late result of the lost attempt changes nothing.
    with session_scope() as s:
        assert "ignored" in service.publish_result(s, {}, final.id, final.celery_task_id)


def test_overdue_run_and_queue_time_out_even_when_alive(service, quiet_celery, github, remote):
    app, client, prefix = quiet_celery
    probe = watchdog.TaskProbe(app, service.settings.worker_keys)
    s = service.settings
    ev = open_pr(service, github, remote)
    (f,) = find(service, probe, s.queue_deadline_s + 1)  # the message is there, but nobody took it for a day
    assert (f.reason, f.kind, f.context["limit_s"]) == (InfraReason.QUEUE_TIMEOUT, InfraKind.TIMEOUT,
                                                        s.queue_deadline_s)
    start(service, ev)
    beat = heartbeat.Heartbeat(client, prefix, ev.celery_task_id,
                               heartbeat.signed_value(ev.celery_task_id, "gpu0@box")).start()
    try:
        assert find(service, probe, s.eval_deadline_s - 60) == []
        (f,) = find(service, probe, s.eval_deadline_s + 1)  # alive, but hung past the deadline
        assert (f.reason, f.kind) == (InfraReason.RUN_TIMEOUT, InfraKind.TIMEOUT)
        assert "retry 2/2" in act(service, f)
    finally:
        beat.stop()
    (retry,) = evaluations()
    assert (retry.state, retry.attempt) == (EvalState.QUEUED, 2)
    (comment,) = github.comments_on(github.repos["codertocat/hello-world"], 2)
    assert "ran for more than 4 h 00 min without finishing" in comment["body"]


def test_finished_task_whose_result_was_never_published_is_recovered(service, quiet_celery, github, remote,
                                                                     monkeypatch):
    from tests.bot.conftest import WORKER_ID, WORKER_KEY
    from bot.testing.fake_evaluation import result_for
    monkeypatch.setenv("TOKENGATE_WORKER_ID", WORKER_ID)
    monkeypatch.setenv("TOKENGATE_WORKER_KEY", WORKER_KEY)
    app, client, prefix = quiet_celery
    probe = watchdog.TaskProbe(app, service.settings.worker_keys)
    ev = open_pr(service, github, remote)
    start(service, ev)
    from worker.queue.tasks import sign_result
    result = result_for("xl", repo="Codertocat/Hello-World", pr=2, base_sha=ev.base_sha, head_sha=ev.head_sha)
    signed = sign_result(result.to_dict(), {"eval_id": ev.id}, ev.celery_task_id)  # as the GPU worker does
    app.backend.store_result(ev.celery_task_id, signed, "SUCCESS")
    grace = service.settings.watchdog_lost_after_s
    assert find(service, probe, grace / 2) == []  # the publish task may still be on its way
    (f,) = find(service, probe, grace + 1)
    assert f.action is WatchdogAction.RECOVER
    assert act(service, f).endswith(": XL")
    (done,) = evaluations()
    assert (done.state, done.verdict, done.attempt) == (EvalState.DONE, "XL", 1)
    assert github.repos["codertocat/hello-world"].pulls[2].labels == ["eval:XL", "eval-qwen35-tiny:XL"]


def test_message_held_by_a_worker_is_not_lost(service, quiet_celery, github, remote):
    """A worker that reserved the message (prefetch, countdown) holds it in kombu's unacked set, not the queue."""
    app, client, prefix = quiet_celery
    probe = watchdog.TaskProbe(app, service.settings.worker_keys)
    ev = open_pr(service, github, remote)
    queue = Queue(GPU_QUEUE, Exchange(GPU_QUEUE), routing_key=GPU_QUEUE)
    with app.connection_for_read() as conn, conn.Consumer(queue, accept=["json"], prefetch_count=1) as consumer:
        held = []
        consumer.register_callback(lambda body, message: held.append(message))  # never acknowledged
        conn.drain_events(timeout=10)
        assert held and client.llen(f"{prefix}{GPU_QUEUE}") == 0
        assert probe.in_broker(ev.celery_task_id)
        assert find(service, probe, service.settings.watchdog_lost_after_s + 1) == []


def test_only_a_fresh_heartbeat_signed_by_the_attempts_worker_keeps_it_alive(service, quiet_celery, github,
                                                                           remote, monkeypatch):
    """Every GPU worker can write the heartbeat keys. A value another worker forged, a bare hostname, a
    tampered MAC or a copy replayed after the worker died must not keep a dead attempt looking alive."""
    from tests.bot.conftest import WORKER_ID, WORKER_KEY
    from worker.queue import auth

    app, client, prefix = quiet_celery
    ev = open_pr(service, github, remote)
    task = ev.celery_task_id
    keys = {WORKER_ID: WORKER_KEY, "other-gpu": "other-key"}
    probe = watchdog.TaskProbe(app, keys)
    k = heartbeat.key(prefix, task)

    def beat(value):
        client.set(k, value, px=5000)
        return probe.beating(task), probe.beating(task, claimed_by=WORKER_ID)

    now = time.time()
    assert beat(auth.beat_value(task, "gpu0@box", now)) == (True, True)  # this worker's own, fresh
    assert beat("gpu0@box") == (False, False)  # unsigned
    stale = now - 2 * probe.ttl  # a value copied while it was alive, written again after it died
    assert beat(auth.beat_value(task, "gpu0@box", stale)) == (False, False)
    good = json.loads(auth.beat_value(task, "gpu0@box", now))
    assert beat(json.dumps({**good, "t": now + 1})) == (False, False)  # restamped: MAC no longer fits
    assert beat(auth.beat_value("another-task", "gpu0@box", now).replace("another-task", task)) == (False, False)
    for junk in ("[1]", "null", '{"worker": "test-gpu", "t": "nan", "mac": "x"}', json.dumps({**good, "mac": "é"}),
                 b"\xff\xfe"):  # whatever a GPU worker writes, the watchdog answers (and does not crash)
        assert beat(junk) == (False, False), junk
    monkeypatch.setenv("TOKENGATE_WORKER_ID", "other-gpu")
    monkeypatch.setenv("TOKENGATE_WORKER_KEY", "other-key")
    # another known worker: alive only while the attempt is bound to nobody
    assert beat(auth.beat_value(task, "gpu9@box", now)) == (True, False)
    monkeypatch.setenv("TOKENGATE_WORKER_ID", "stranger")
    assert beat(auth.beat_value(task, "gpu9@box", now)) == (False, False)  # a key the bot does not know
    client.delete(k)
