"""Bot-side Celery tasks, queue `publish` (GitHub writes + database updates; credentials live here only)."""
from __future__ import annotations

import logging

from github import GithubException
from sqlalchemy import select

from bot.db.engine import session_scope
from bot.handlers import Handlers
from bot.db.models import Delivery, utcnow
from bot.service import FAILURE_TASK, RESULT_TASK, Service
from bot.web.webhook import HANDLE_TASK
from worker.queue.app import STARTED_TASK, app

log = logging.getLogger(__name__)

# Transient GitHub/network trouble: retried with backoff. Every handler is idempotent (no duplicate
# evaluations for one head, sticky comment edited in place), so a retry after a partial run is safe.
RETRY = {"autoretry_for": (GithubException, ConnectionError), "retry_backoff": True, "retry_backoff_max": 300,
         "max_retries": 5}


def _transient(exc: Exception) -> bool:
    return not isinstance(exc, GithubException) or exc.status >= 500 or exc.status in (403, 429)


@app.task(name=HANDLE_TASK, bind=True, **RETRY)
def handle_delivery(self, delivery_id: str, event: str, payload: dict) -> str:
    with session_scope() as session:
        delivery = session.scalar(select(Delivery).where(Delivery.id == delivery_id).with_for_update())
        if delivery is not None and delivery.processed_at is not None:
            return f"delivery {delivery_id} already processed"
        try:
            outcome = Handlers(Service()).dispatch(session, event, payload)
        except GithubException as exc:
            if not _transient(exc):
                log.exception("delivery %s: GitHub refused", delivery_id)
                outcome = f"GitHub error {exc.status}: {exc.data}"
            else:
                raise
        delivery = session.get(Delivery, delivery_id)
        if delivery is not None:
            delivery.processed_at = utcnow()
            delivery.outcome = outcome[:2000]
    log.info("delivery %s (%s): %s", delivery_id, event, outcome)
    return outcome


@app.task(name=STARTED_TASK, **RETRY)
def evaluation_started(eval_id: int, hostname: str | None = None, task_id: str | None = None) -> str:
    with session_scope() as session:
        return Service().evaluation_started(session, eval_id, hostname, task_id)


@app.task(name=RESULT_TASK, **RETRY)
def publish_result(result: dict, eval_id: int, task_id: str | None = None) -> str:
    with session_scope() as session:
        outcome = Service().publish_result(session, result, eval_id, task_id)
    log.info("result for evaluation %s: %s", eval_id, outcome)
    return outcome


@app.task(name=FAILURE_TASK, **RETRY)
def evaluation_failed(*args) -> str:
    """Errback of the gpu task: (failed_task_id, eval_id, task_id) when forwarded through the broker,
    (request, exc, traceback, eval_id, task_id) when Celery calls it in-process."""
    *head, eval_id, task_id = args
    detail = "the evaluation task failed"
    if len(head) >= 2 and isinstance(head[1], BaseException):
        detail = f"{type(head[1]).__name__}: {head[1]}"
    elif head:
        from bot.queue.app import celery_app
        res = celery_app().AsyncResult(head[0])
        if res.failed():
            detail = f"{type(res.result).__name__}: {res.result}"
    with session_scope() as session:
        return Service().evaluation_failed(session, eval_id, task_id, detail)


ROUNDS_TASK = "tokengate.close_due_rounds"
ROUNDS_CHECK_S = 300.0
WATCHDOG_TASK = "tokengate.reap_lost_evaluations"


@app.task(name=ROUNDS_TASK)
def close_due_rounds() -> list[str]:
    """Close every merge-first round whose window has ended (beat runs this every few minutes)."""
    from bot.rounds import close_due_rounds as close
    with session_scope() as session:
        return ["\n".join(plan.lines()) for plan in close(session, Service())]


@app.task(name=WATCHDOG_TASK)
def reap_lost_evaluations() -> list[str]:
    """Active evaluations whose task vanished or is overdue → INFRA, retried per settings (beat, every minute)."""
    from bot.queue import watchdog
    service = Service()
    with session_scope() as session:
        findings = watchdog.inspect_active(session, service.settings, watchdog.TaskProbe(service.celery))
    outcomes = []
    for finding in findings:  # one transaction each: one failure does not hold up the others
        try:
            with session_scope() as session:
                outcomes.append(watchdog.act(session, service, finding))
        except Exception:  # noqa: BLE001 - logged; the next beat tries again
            log.exception("watchdog: evaluation %s (%s)", finding.eval_id, finding.action)
    for line in outcomes:
        log.warning("watchdog: %s", line)
    return outcomes


def schedule_periodic(celery) -> None:
    """The publish worker's beat: close due rounds, reap lost evaluations."""
    from bot.settings import get_settings
    celery.conf.beat_schedule = {
        "close-due-rounds": {"task": ROUNDS_TASK, "schedule": ROUNDS_CHECK_S, "options": {"queue": "publish"}},
        "reap-lost-evaluations": {"task": WATCHDOG_TASK, "schedule": get_settings().watchdog_interval_s,
                                  "options": {"queue": "publish", "expires": get_settings().watchdog_interval_s}},
    }
