"""Bot-side Celery tasks, queue `publish` (GitHub writes + database updates; credentials live here only)."""
from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta

from github import GithubException
from kombu.exceptions import KombuError
from redis.exceptions import RedisError
from requests.exceptions import RequestException
from sqlalchemy.exc import OperationalError
from structlog.contextvars import bound_contextvars

from bot import metrics
from bot.db.engine import session_scope
from bot.db.models import Delivery, aware, utcnow
from bot.handlers import Handlers
from bot.queue import outbox
from bot.queue.lease import ClaimRenewal
from bot.queue.outbox import DRAIN_TASK, HANDLE_TASK, HANDLING, claimed
from bot.service import FAILURE_TASK, RESULT_TASK, NoInstallation, Service
from bot.settings import get_settings
from worker.queue.app import STARTED_TASK, app

log = logging.getLogger(__name__)

# The evaluation-side tasks: GitHub trouble inside them is retried by Celery (their effect is idempotent).
RETRY = {"autoretry_for": (GithubException, RequestException, ConnectionError, OSError), "retry_backoff": True,
         "retry_backoff_max": 300, "max_retries": 18}  # ~1 h in all
MAX_BUG_ATTEMPTS = 5  # a handler that raises something else (a bug, a hostile payload) is retried this often


def transient(exc: BaseException) -> bool:
    """Worth retrying: transport errors, GitHub 5xx and rate limits, an unreachable database or broker."""
    if isinstance(exc, GithubException):
        return exc.status is None or exc.status >= 500 or exc.status in (403, 429)
    return isinstance(exc, (RequestException, ConnectionError, OSError, OperationalError, KombuError,
                            RedisError, TimeoutError))


def retry_after(exc: BaseException, attempts: int, settings) -> float:
    """Exponential backoff (capped); a rate limit waits for its reset time."""
    headers = getattr(exc, "headers", None) or {}
    if isinstance(exc, GithubException) and exc.status in (403, 429):
        if headers.get("retry-after", "").isdigit():
            return float(headers["retry-after"])
        reset = headers.get("x-ratelimit-reset")
        if reset and reset.isdigit() and headers.get("x-ratelimit-remaining") == "0":
            return max(1.0, float(reset) - time.time())
    return min(settings.github_retry_max_backoff_s, 2.0 ** attempts)


@app.task(name=HANDLE_TASK, bind=True)
def handle_delivery(self, delivery_id: str, *_legacy) -> str:
    """Handle one stored delivery by id; processed only in the transaction that stores its effect."""
    with bound_contextvars(delivery_id=delivery_id):
        return _handle(delivery_id)


def _handle(delivery_id: str) -> str:
    settings = get_settings()
    with session_scope() as session:
        delivery = session.get(Delivery, delivery_id, with_for_update=True)
        if delivery is None:
            return f"delivery {delivery_id}: not stored (nothing to do)"
        if delivery.processed_at is not None or delivery.failed_at is not None:
            return f"delivery {delivery_id} already processed"
        if claimed(delivery, utcnow()):
            return f"delivery {delivery_id} being handled by another task"
        event = delivery.event
        try:
            payload = outbox.payload_of(delivery)
        except outbox.BadBody as exc:  # signed, but no retry will make it JSON: given up on at once
            delivery.failed_at = utcnow()
            delivery.outcome = f"given up: {exc}"[:2000]
            metrics.HANDLED.labels(event, "failed").inc()
            return delivery.outcome
        action = payload.get("action")
        action = outbox.scrub(action)[:64] if isinstance(action, str) else None
        repo = payload.get("repository") if isinstance(payload.get("repository"), dict) else {}
        pull = payload.get("pull_request") or payload.get("issue")
        pull = pull if isinstance(pull, dict) else {}
        claim = _claim(delivery, settings)
        session.info[outbox.HANDLING_DELIVERY] = delivery_id
        try:
            with bound_contextvars(event=event, repo=repo.get("full_name"), pr=pull.get("number")), \
                    ClaimRenewal(delivery_id, claim, settings.handler_lease_s, settings.handler_max_s):
                outcome = Handlers(Service()).dispatch(session, event, payload)
        except NoInstallation as exc:
            outcome = f"not installed: {exc}"
        except GithubException as exc:
            metrics.record_github_error(exc)
            if transient(exc):
                session.rollback()
                return _failed(delivery_id, exc, settings, claim)
            log.warning("delivery %s: GitHub refused (%s)", delivery_id, exc.status)
            outcome = f"GitHub error {exc.status}: {str(exc.data)[:500]}"
        except Exception as exc:  # noqa: BLE001 - recorded on the row and retried
            if isinstance(exc, RequestException):
                metrics.record_github_error(exc)
            session.rollback()
            return _failed(delivery_id, exc, settings, claim)
        delivery = session.get(Delivery, delivery_id, with_for_update=True, populate_existing=True)
        if delivery is not None:
            delivery.processed_at = utcnow()
            delivery.action = action  # read from the body here: the web request never parses it
            delivery.outcome = outcome[:2000]
            delivery.last_error = None
    metrics.HANDLED.labels(event, "processed").inc()
    log.info("delivery handled", extra={"outcome": outcome})
    return outcome


def _claim(delivery: Delivery, settings) -> str:
    """Claim the delivery for `handler_lease_s` before its handler runs, so that every commit storing part of its
    effect stores the claim too. A dispatch commits in the middle of the handler (Service._dispatch), releasing
    this row's lock: a second handle task of the delivery (the drain's re-send) found it free and handled it
    again. The claim lapses rather than marking the delivery processed: a handler that dies after such a commit
    is handled again (the outbox finds it due when the claim ends). Returns the claim, which `_failed` takes back."""
    delivery.outcome = f"{HANDLING} (claim {uuid.uuid4().hex[:12]})"
    delivery.next_attempt_at = utcnow() + timedelta(seconds=settings.handler_lease_s)
    return delivery.outcome


def _failed(delivery_id: str, exc: BaseException, settings, claim: str) -> str:
    """Record the failure on the row; the outbox sends it again after the backoff, or it is given up on. The
    handler's `claim`, if a commit inside it was stored, is taken back (never another handling's)."""
    detail = f"{type(exc).__name__}: {exc}"[:2000]
    with session_scope() as session:
        d = session.get(Delivery, delivery_id, with_for_update=True)
        if d is None or d.processed_at is not None or claimed(d, utcnow()) and d.outcome != claim:
            return detail  # stored by another handling since, or claimed by one
        d.outcome = None
        d.attempts += 1
        d.last_error = detail
        now = utcnow()
        too_old = (now - aware(d.received_at)).total_seconds() > settings.github_retry_for_s
        if too_old or (not transient(exc) and d.attempts >= MAX_BUG_ATTEMPTS):
            d.failed_at = now
            d.outcome = f"given up after {d.attempts} attempt(s): {detail}"
            outcome = "failed"
        else:
            d.next_attempt_at = now + timedelta(seconds=retry_after(exc, d.attempts, settings))
            outcome = "retry"
        event = d.event
    metrics.HANDLED.labels(event, outcome).inc()
    log.warning("delivery %s: %s (%s)", delivery_id, detail, outcome, exc_info=None if transient(exc) else exc)
    return f"{outcome}: {detail}"


@app.task(name=DRAIN_TASK)
def drain_outbox() -> int:
    """Beat: send every due delivery again (never sent, lost in a broker restart, or past its backoff)."""
    with session_scope() as session:
        sent = outbox.drain(session, get_settings())
    if sent:
        log.info("outbox: %d deliveries sent again", len(sent))
    return len(sent)


@app.task(name=STARTED_TASK, **RETRY)
def evaluation_started(eval_id: int, hostname: str | None = None, task_id: str | None = None,
                       claim: dict | None = None) -> str:
    with bound_contextvars(eval_id=eval_id), session_scope() as session:
        outcome = Service().evaluation_started(session, eval_id, hostname, task_id, claim)
    log.info("start claim for evaluation %s: %s", eval_id, outcome)
    return outcome


@app.task(name=RESULT_TASK, **RETRY)
def publish_result(result: dict, eval_id: int, task_id: str | None = None) -> str:
    with bound_contextvars(eval_id=eval_id), session_scope() as session:
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
        probe = watchdog.TaskProbe(service.celery, service.settings.worker_keys)
        findings = watchdog.inspect_active(session, service.settings, probe)
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
    """The publish worker's beat: close due rounds, reap lost evaluations, drain the delivery outbox, send main
    measurements that were never sent, edit change-point posts GitHub refused."""
    from bot.history.tasks import REFRESH_TASK, RESEND_TASK
    celery.conf.beat_schedule = {
        "close-due-rounds": {"task": ROUNDS_TASK, "schedule": ROUNDS_CHECK_S, "options": {"queue": "publish"}},
        "reap-lost-evaluations": {"task": WATCHDOG_TASK, "schedule": get_settings().watchdog_interval_s,
                                  "options": {"queue": "publish", "expires": get_settings().watchdog_interval_s}},
        "drain-outbox": {"task": DRAIN_TASK, "schedule": get_settings().outbox_interval_s,
                         "options": {"queue": "publish", "expires": get_settings().outbox_interval_s}},
        "resend-unsent-measurements": {"task": RESEND_TASK, "schedule": get_settings().watchdog_interval_s,
                                       "options": {"queue": "publish", "expires": get_settings().watchdog_interval_s}},
        "refresh-stale-change-point-posts": {"task": REFRESH_TASK, "schedule": get_settings().watchdog_interval_s,
                                             "options": {"queue": "publish",
                                                         "expires": get_settings().watchdog_interval_s}},
    }
