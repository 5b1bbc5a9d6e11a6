"""The one Celery app shared by both sides (no import of bot here: imports go bot → worker).

Tasks bind to `app` at import (`@app.task(name=...)` in worker/tasks.py and bot/tasks.py);
the process that starts a worker or sends a task calls `configure()` once with its broker URL.
Queues: `gpu` (evaluations, GPU boxes, no credentials) and `publish` (GitHub writes and DB updates,
bot side only). The two sides talk only by task *name*, never by import.
"""
from __future__ import annotations

from celery import Celery
from celery.signals import task_prerun
from kombu import Queue

EVALUATE_TASK = "tokengate.evaluate"  # gpu: job dict -> EvalResult.to_dict()
STARTED_TASK = "tokengate.evaluation_started"  # publish: (eval_id, hostname), sent when an evaluation starts
GPU_QUEUE = "gpu"
PUBLISH_QUEUE = "publish"

app = Celery("tokengate", set_as_current=True)


def configure(broker_url: str, result_backend: str | None = None, key_prefix: str = "", **overrides) -> Celery:
    """Point `app` at a broker; call once per process before sending tasks or starting a worker."""
    transport = {"global_keyprefix": key_prefix} if key_prefix else {}
    app.conf.update(
        broker_url=broker_url,
        result_backend=result_backend or broker_url,
        broker_transport_options=transport,
        result_backend_transport_options=transport,
        task_queues=(Queue(GPU_QUEUE), Queue(PUBLISH_QUEUE)),
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


@task_prerun.connect
def _announce_start(task_id=None, task=None, args=None, kwargs=None, **_):
    """Tell the bot side that an evaluation left the queue (→ check run in_progress), by task name only."""
    if task is None or task.name != EVALUATE_TASK:
        return
    job = (args[0] if args else None) or (kwargs or {}).get("job") or {}
    if "eval_id" in job:
        app.send_task(STARTED_TASK, args=[job["eval_id"], task.request.hostname, task_id], queue=PUBLISH_QUEUE)
