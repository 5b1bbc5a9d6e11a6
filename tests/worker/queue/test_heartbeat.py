"""Heartbeats of running evaluations (real Redis): refreshed while the task runs, gone when it ends,
lapsing on their own when the process dies without cleaning up."""
from __future__ import annotations

import time

import pytest

from tests.services import redis_namespace
from worker.queue import heartbeat

REDIS_URL = "redis://127.0.0.1:6379/13"
pytestmark = pytest.mark.services


@pytest.fixture
def redis_prefix():
    with redis_namespace("hb") as (_, client, prefix):
        yield client, prefix


def test_beats_while_running_and_disappears_when_stopped(redis_prefix):
    client, prefix = redis_prefix
    beat = heartbeat.Heartbeat(client, prefix, "task-1", "gpu0@box", interval=0.2, ttl=1.0).start()
    try:
        assert heartbeat.is_alive(client, prefix, "task-1")
        time.sleep(1.5)  # longer than the TTL: only the refreshes keep it
        assert heartbeat.is_alive(client, prefix, "task-1")
        assert client.get(heartbeat.key(prefix, "task-1")) == b"gpu0@box"
        assert 0 < client.pttl(heartbeat.key(prefix, "task-1")) <= 1000
    finally:
        beat.stop()
    assert not heartbeat.is_alive(client, prefix, "task-1")
    assert not heartbeat.is_alive(client, prefix, "never-started")


def test_a_dead_process_stops_looking_alive_after_the_ttl(redis_prefix):
    client, prefix = redis_prefix
    beat = heartbeat.Heartbeat(client, prefix, "task-2", "gpu1@box", interval=0.2, ttl=1.0).start()
    beat._stop.set()  # the thread stops refreshing and nobody deletes the key: a killed worker
    beat._thread.join()
    assert heartbeat.is_alive(client, prefix, "task-2")
    time.sleep(1.2)
    assert not heartbeat.is_alive(client, prefix, "task-2")


def test_the_evaluation_task_beats_only_while_it_runs(redis_prefix):
    """The task_prerun/postrun hooks of worker/queue/app.py, through a real worker thread (an app of its own,
    so the process-wide app and whatever task it has registered are left alone)."""
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    from worker.queue.app import EVALUATE_TASK, HEARTBEAT_TTL_CONF
    client, prefix = redis_prefix
    seen = {}
    app = Celery("heartbeat-test", set_as_current=False)
    opts = {"global_keyprefix": prefix}
    app.conf.update(broker_url=REDIS_URL, result_backend=REDIS_URL, broker_transport_options=opts,
                    result_backend_transport_options=opts, **{HEARTBEAT_TTL_CONF: 2.0})

    # Finalizing registers shared tasks of other modules on this app too (a fake evaluation of the bot's tests,
    # say): drop whatever holds the name, then register ours.
    app.tasks.pop(EVALUATE_TASK, None)

    @app.task(name=EVALUATE_TASK, bind=True, shared=False)
    def evaluate(self, job):
        seen["alive"] = heartbeat.is_alive(client, prefix, self.request.id)
        seen["ttl_ms"] = client.pttl(heartbeat.key(prefix, self.request.id))
        return {"ok": True}

    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
        res = app.send_task(EVALUATE_TASK, args=[{}])
        assert res.get(timeout=30) == {"ok": True}
    assert seen["alive"] and 0 < seen["ttl_ms"] <= 2000
    assert not heartbeat.is_alive(client, prefix, res.id)
    app.close()
