"""The broker's ACL users, created on the real local Redis for this test and removed afterwards.

A real Celery worker logged in as the GPU user consumes an evaluation from the `gpu` queue, beats,
announces the start and returns its result onto `publish` — with no ACL denial logged; the same user
can neither read nor take anything from `publish`, nor touch keys outside its patterns or run admin
commands. Without a password nobody gets in at all.
"""
from __future__ import annotations

import secrets
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from celery import Celery, signature
from kombu import Exchange, Queue

from bot.queue import acl
from tests.bot.conftest import REDIS, wait_until
from worker.queue.app import EVALUATE_TASK, GPU_QUEUE, PUBLISH_QUEUE, STARTED_TASK, declare_queues, gpu_side

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.services, pytest.mark.timeout(90)]


@pytest.fixture
def users():
    admin = redis.Redis.from_url(f"{REDIS}/13")
    try:
        admin.ping()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"Redis on 127.0.0.1:6379 is not reachable: {exc} (start it: redis-server --daemonize yes)")
    tag = secrets.token_hex(4)
    prefix = f"tokengate-acl-{tag}:"
    names = {"web": f"tg-web-{tag}", "gpu": f"tg-gpu-{tag}"}
    passwords = {k: secrets.token_hex(12) for k in names}
    admin.execute_command("ACL", "SETUSER", names["web"], "reset", *acl.web_rules(passwords["web"], prefix))
    admin.execute_command("ACL", "SETUSER", names["gpu"], "reset", *acl.gpu_rules(passwords["gpu"], prefix))
    admin.execute_command("ACL", "LOG", "RESET")
    urls = {k: f"redis://{names[k]}:{passwords[k]}@127.0.0.1:6379/13" for k in names}
    try:
        yield urls, names, prefix, admin
    finally:
        for name in names.values():
            admin.execute_command("ACL", "DELUSER", name)
        for key in admin.scan_iter(match=f"{prefix}*", count=1000):
            admin.delete(key)


def make_app(name: str, url: str, prefix: str) -> Celery:
    """A Celery app configured like worker.queue.app (queues, acks_late, JSON), on its own user."""
    app = Celery(name, set_as_current=False)
    transport = {"global_keyprefix": prefix}
    app.conf.update(broker_url=url, result_backend=url, broker_transport_options=transport,
                    result_backend_transport_options=transport, task_default_queue=PUBLISH_QUEUE,
                    task_queues=tuple(Queue(q, Exchange(q, type="direct"), routing_key=q)
                                      for q in (GPU_QUEUE, PUBLISH_QUEUE)),
                    task_serializer="json", result_serializer="json", accept_content=["json"],
                    task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
                    task_track_started=True, worker_hijack_root_logger=False)
    return app


def denied(client, *command) -> bool:
    try:
        client.execute_command(*command)
    except redis.exceptions.NoPermissionError:
        return True
    except redis.exceptions.ResponseError as exc:
        return "NOPERM" in str(exc)
    return False


def gpu_worker_app(url: str, prefix: str) -> Celery:
    """The GPU side as `tokengate worker --queues gpu` configures it, with a stand-in evaluate."""
    app = gpu_side(make_app("acl-gpu", url, prefix))
    app.finalize(auto=True)  # shared tasks first: the real evaluate (if imported) would keep the name
    app.tasks.pop(EVALUATE_TASK, None)  # app.task() returns an existing task of that name, not ours

    @app.task(name=EVALUATE_TASK, shared=False)
    def evaluate(job: dict) -> dict:  # the worker's side of it: beat (task_prerun signal), return a record
        time.sleep(0.3)
        return {"verdict": "XL", "eval_id": job["eval_id"]}
    return app


def serve_gpu(url: str, prefix: str) -> None:
    """The GPU worker in a process of its own (run by the test below). In the test's process it would share
    Celery's per-process state with tests/bot's package worker: its exit stops every worker thread there
    (`state.should_terminate`), and the two trade kombu's one event loop."""
    gpu_worker_app(url, prefix).worker_main(["worker", "--pool=solo", f"--queues={GPU_QUEUE}", "--loglevel=WARNING",
                                             "--without-heartbeat", "--without-mingle", "--without-gossip"])


@contextmanager
def gpu_worker_process(url: str, prefix: str):
    code = f"from tests.bot.queue.test_broker_acl import serve_gpu; serve_gpu({url!r}, {prefix!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    try:
        yield proc
    finally:
        proc.terminate()  # SIGTERM: Celery's warm shutdown
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_gpu_user_consumes_gpu_and_writes_results_only(users):
    urls, names, prefix, admin = users
    web_app = make_app("acl-web", urls["web"], prefix)
    declare_queues(web_app)  # the web side writes the routing tables, as the publish worker does at start
    with gpu_worker_process(urls["gpu"], prefix) as proc:
        task = web_app.send_task(EVALUATE_TASK, args=[{"eval_id": 7}], queue=GPU_QUEUE,
                                 link=signature("tokengate.publish_result", args=[7], queue=PUBLISH_QUEUE,
                                                app=web_app))
        assert task.get(timeout=30) == {"verdict": "XL", "eval_id": 7}  # the result backend, read as web
        # The start announcement and the result's publish task both reached the publish queue.
        wait_until(lambda: admin.llen(f"{prefix}{PUBLISH_QUEUE}") >= 2, timeout=10, what="publish messages")
        assert proc.poll() is None, "the GPU worker exited"
    bodies = [m.decode() for m in admin.lrange(f"{prefix}{PUBLISH_QUEUE}", 0, -1)]
    assert any(STARTED_TASK in b for b in bodies) and any("tokengate.publish_result" in b for b in bodies)
    log = [e for e in admin.execute_command("ACL", "LOG") if names["gpu"].encode() in _flat(e)]
    assert log == [], f"the GPU worker was denied something it needs: {log}"

    gpu = redis.Redis.from_url(urls["gpu"])
    queue = f"{prefix}{PUBLISH_QUEUE}"
    assert denied(gpu, "LRANGE", queue, 0, -1)  # cannot read the publish queue ...
    assert denied(gpu, "RPOP", queue)  # ... nor take a message from it
    assert denied(gpu, "BRPOP", queue, 1)
    assert denied(gpu, "GET", f"{prefix}anything-else")  # nothing outside its patterns
    assert denied(gpu, "SET", "tokengate:alive:x", "1")  # nor outside the deployment's prefix
    binding = f"{prefix}_kombu.binding.{PUBLISH_QUEUE}"
    assert gpu.smembers(binding)  # it looks routes up ...
    assert denied(gpu, "SADD", binding, "publish\x06\x16\x06\x16gpu")  # ... but cannot re-route publish to itself
    assert denied(gpu, "DEL", binding)
    assert denied(gpu, "LPUSH", f"{prefix}publish@host.celery.pidbox", "{}")  # no other worker's control mailbox
    for command in (("FLUSHALL",), ("CONFIG", "GET", "*"), ("KEYS", "*"), ("ACL", "LIST"), ("SHUTDOWN",)):
        assert denied(gpu, *command), command
    web = redis.Redis.from_url(urls["web"])
    assert web.lrange(queue, 0, -1)  # the publish side reads it
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(urls["gpu"].replace(urls["gpu"].split(":")[2].split("@")[0], "wrong")).ping()


def _flat(entry) -> bytes:
    if isinstance(entry, (list, tuple)):
        return b" ".join(_flat(e) for e in entry)
    if isinstance(entry, dict):
        return b" ".join(_flat(k) + b" " + _flat(v) for k, v in entry.items())
    return entry if isinstance(entry, bytes) else str(entry).encode()
