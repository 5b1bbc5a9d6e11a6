"""The one Celery app shared by both sides (no import of bot here: imports go bot → worker).

Tasks bind to `app` at import (`@app.task(name=...)` in worker/queue/tasks.py and bot/queue/tasks.py);
the process that starts a worker or sends a task calls `configure()` once with its broker URL.
Queues: `gpu` (evaluations, GPU boxes, no credentials) and `publish` (GitHub writes and DB updates,
bot side only). The two sides talk only by task *name*, never by import.
"""
from __future__ import annotations

import threading

from celery import Celery
from celery.signals import task_postrun, task_prerun
from kombu import Exchange, Queue

from worker.queue import auth, heartbeat

EVALUATE_TASK = "tokengate.evaluate"  # gpu: job dict -> EvalResult.to_dict()
STARTED_TASK = "tokengate.evaluation_started"  # publish: (eval_id, hostname, task id, signed claim), at the start
HEARTBEAT_TTL_CONF = "tokengate_heartbeat_ttl_s"  # app.conf key; heartbeat.TTL_S when unset
GPU_QUEUE = "gpu"
PUBLISH_QUEUE = "publish"

app = Celery("tokengate", set_as_current=True)
_heartbeats: dict[str, heartbeat.Heartbeat] = {}  # task id → the thread keeping it visibly alive


def configure(broker_url: str, result_backend: str | None = None, key_prefix: str = "", **overrides) -> Celery:
    """Point `app` at a broker; call once per process before sending tasks or starting a worker (calling it
    again — tests — also drops what the app built from the old settings)."""
    _forget_connections()
    transport = {"global_keyprefix": key_prefix} if key_prefix else {}
    app.conf.update(
        broker_url=broker_url,
        result_backend=result_backend or broker_url,
        broker_transport_options=transport,
        result_backend_transport_options=transport,
        # One direct exchange per queue, routing key = queue name: a message reaches exactly one queue
        # (with bare Queue(name) both queues were bound to the default exchange under one key).
        task_queues=queues(declare=True),
        task_default_queue=PUBLISH_QUEUE,
        task_routes={EVALUATE_TASK: {"queue": GPU_QUEUE}},
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_acks_late=True,  # a GPU box that dies mid-evaluation gives the job back
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # one evaluation per GPU worker at a time, no hoarding
        task_track_started=True,
        result_expires=7 * 24 * 3600,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.conf.update(overrides)
    return app


def queues(declare: bool) -> tuple[Queue, ...]:
    """The two queues; `declare=False` for a GPU worker, whose broker user may only read the routing
    tables (bot/queue/acl.py): it never (re)declares them, the web side does (`declare_queues`)."""
    return tuple(Queue(q, Exchange(q, type="direct"), routing_key=q, no_declare=not declare)
                 for q in (GPU_QUEUE, PUBLISH_QUEUE))


def declare_queues(owner: Celery | None = None) -> None:
    """Write both queues' routing tables (web side, at start): a GPU worker routes its started/result
    messages through them but cannot create them."""
    owner = owner or app
    with owner.connection_for_write() as conn:
        for q in queues(declare=True):
            q.bind(conn.default_channel).declare()


def gpu_side(owner: Celery | None = None) -> Celery:
    """Configure `owner` as a GPU worker: no queue declarations, no remote-control mailbox."""
    owner = owner or app
    owner.conf.update(task_queues=queues(declare=False), worker_enable_remote_control=False)
    return owner


def _forget_connections() -> None:
    """Celery caches the broker pool, the result backend and the queue declarations on first use; after a
    change of broker or key prefix they would still point at the old ones."""
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app._backend_cache = None
    app._local = threading.local()
    for cached in ("amqp", "control"):
        app.__dict__.pop(cached, None)


@task_prerun.connect
def _announce_start(task_id=None, task=None, args=None, kwargs=None, **_):
    """An evaluation left the queue: start its heartbeat (the bot's watchdog reads it) and tell the bot
    side (→ check run in_progress), by task name only."""
    if task is None or task.name != EVALUATE_TASK:
        return
    owner = task.app  # the app that runs it (`app` in production; tests may use their own)
    client, prefix = heartbeat.broker_redis(owner)
    if client is not None and task_id:
        ttl = float(owner.conf.get(HEARTBEAT_TTL_CONF) or heartbeat.TTL_S)
        _heartbeats[task_id] = heartbeat.Heartbeat(client, prefix, task_id,
                                                   heartbeat.signed_value(task_id, task.request.hostname or ""),
                                                   interval=ttl / 4, ttl=ttl).start()
    job = (args[0] if args else None) or (kwargs or {}).get("job") or {}
    if isinstance(job, dict) and "eval_id" in job:
        # Signed with this worker's own key: the bot binds this attempt to the first worker that claims it.
        claim = auth.sign_claim(job["eval_id"], task_id)
        owner.send_task(STARTED_TASK, args=[job["eval_id"], task.request.hostname, task_id, claim],
                        queue=PUBLISH_QUEUE)


@task_postrun.connect
def _stop_heartbeat(task_id=None, task=None, **_):
    beat = _heartbeats.pop(task_id, None) if task_id else None
    if beat is not None:
        beat.stop()
