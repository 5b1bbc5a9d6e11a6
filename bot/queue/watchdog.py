"""Watchdog: active evaluations whose task vanished or is overdue become INFRA (and are retried per settings).

Runs from the publish worker's beat every `watchdog_interval_s`. What counts as a live task:
  running → its heartbeat key (worker/queue/heartbeat.py) exists in Redis;
  queued  → its message is still in the `gpu` queue or held unacknowledged by a worker, or it
            already beats (the "started" message is on its way).
A task that finished but whose result has not been published yet is not lost: the result is in
the result backend, and after the grace period the watchdog publishes it itself.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from celery import Celery, states
from sqlalchemy import select
from sqlalchemy.orm import Session

from bot.enums import EvalState, InfraReason, WatchdogAction
from bot.db.models import Evaluation, aware, utcnow
from bot.settings import Settings
from worker.queue import auth, heartbeat
from worker.queue.app import GPU_QUEUE, HEARTBEAT_TTL_CONF
from worker.records import InfraKind

log = logging.getLogger(__name__)

PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")  # kombu's Redis priority lists of one queue


RECHECK_S = 0.5  # the second look at a task found nowhere: a worker moves a message in two steps


class TaskProbe:
    """Looks a task id up in Redis: heartbeat, queue lists, the unacked hash, the result backend."""

    def __init__(self, celery: Celery, worker_keys: dict[str, str] | None = None):
        self.celery = celery
        self.client, self.prefix = heartbeat.broker_redis(celery)
        self.worker_keys = worker_keys or {}  # with keys, only a fresh heartbeat signed by the attempt's worker counts
        self.ttl = float(celery.conf.get(HEARTBEAT_TTL_CONF) or heartbeat.TTL_S)

    @property
    def can_see(self) -> bool:
        return self.client is not None

    def beating(self, task_id: str, claimed_by: str | None = None) -> bool:
        if self.client is None:
            return False
        return heartbeat.is_alive(self.client, self.prefix, task_id, lambda raw: auth.beat_valid(
            raw, task_id, self.worker_keys, now=time.time(), ttl=self.ttl, claimed_by=claimed_by))

    def in_broker(self, task_id: str) -> bool:
        """The message waits in the gpu queue or sits with a worker (reserved, prefetched, countdown)."""
        if self.client is None:
            return True  # cannot tell: never call it lost
        needle = task_id.encode()
        for suffix in PRIORITY_SUFFIXES:
            if any(needle in raw for raw in self.client.lrange(f"{self.prefix}{GPU_QUEUE}{suffix}", 0, -1)):
                return True
        return any(needle in raw for raw in self.client.hvals(f"{self.prefix}unacked"))

    def anywhere(self, task_id: str) -> bool:
        """Queued, with a worker (heartbeat), or finished: the task exists somewhere."""
        return self.in_broker(task_id) or self.beating(task_id) or self.finished(task_id) is not None

    def finished(self, task_id: str) -> tuple[str, object, datetime | None] | None:
        """(state, result, done at) when the result backend holds the task's outcome, else None."""
        res = self.celery.AsyncResult(task_id)
        state = res.state
        if state not in (states.SUCCESS, states.FAILURE):
            return None
        return state, res.result, aware(res.date_done)


@dataclass
class Finding:
    eval_id: int
    task_id: str
    action: WatchdogAction
    reason: InfraReason | None = None
    kind: InfraKind | None = None
    detail: str = ""
    context: dict = field(default_factory=dict)
    outcome: tuple[str, object] | None = None  # (celery state, result) for RECOVER
    claimed_by: str | None = None  # the worker bound to the attempt: only its heartbeat counts on the recheck


def _age(since: datetime | None, now: datetime) -> float | None:
    if since is None:
        return None
    return (now - aware(since)).total_seconds()


def inspect_active(session: Session, settings: Settings, probe: TaskProbe, now: datetime | None = None,
                   recheck_s: float = RECHECK_S) -> list[Finding]:
    """Every active evaluation that is lost, overdue, or finished but never published (read only)."""
    now = now or utcnow()
    grace = settings.watchdog_lost_after_s
    out: list[Finding] = []
    evs = session.scalars(select(Evaluation).where(Evaluation.state.in_([EvalState.QUEUED, EvalState.RUNNING]),
                                                   Evaluation.celery_task_id.is_not(None)).order_by(Evaluation.id))
    for ev in evs:
        task = ev.celery_task_id
        if ev.unsent:
            out.append(Finding(ev.id, task, WatchdogAction.RESEND))  # never reached the broker (Service._dispatch)
            continue
        since_dispatch = _age(ev.dispatched_at or ev.created_at, now) or 0.0
        if ev.state is EvalState.RUNNING:
            running_for = _age(ev.started_at, now) or since_dispatch
            if running_for > settings.eval_deadline_s:
                out.append(Finding(ev.id, task, WatchdogAction.LOST, InfraReason.RUN_TIMEOUT, InfraKind.TIMEOUT,
                                   f"running for {running_for:.0f} s on {ev.worker_host or 'an unknown worker'} "
                                   f"(deadline {settings.eval_deadline_s:.0f} s)",
                                   {"limit_s": settings.eval_deadline_s}))
                continue
            if running_for <= grace or not probe.can_see or probe.beating(task, ev.claimed_by):
                continue
        else:
            if probe.beating(task, ev.claimed_by):
                continue  # started; the "started" message is on its way
            if since_dispatch > settings.queue_deadline_s:
                out.append(Finding(ev.id, task, WatchdogAction.LOST, InfraReason.QUEUE_TIMEOUT, InfraKind.TIMEOUT,
                                   f"queued for {since_dispatch:.0f} s (deadline {settings.queue_deadline_s:.0f} s)",
                                   {"limit_s": settings.queue_deadline_s}))
                continue
            if since_dispatch <= grace or not probe.can_see or probe.in_broker(task):
                continue
        # No live task. Did it finish with the result still on its way (or lost on the way)?
        done = probe.finished(task)
        if done is not None:
            state, result, done_at = done
            if (_age(done_at, now) or 0.0) > grace:
                out.append(Finding(ev.id, task, WatchdogAction.RECOVER, outcome=(state, result)))
            continue
        if ev.state is EvalState.RUNNING:
            out.append(Finding(ev.id, task, WatchdogAction.LOST, InfraReason.WORKER_LOST, InfraKind.WORKER_LOST,
                               f"no heartbeat from {ev.worker_host or 'its worker'} for more than {grace:.0f} s",
                               {"worker": ev.worker_host}, claimed_by=ev.claimed_by))
        else:
            out.append(Finding(ev.id, task, WatchdogAction.LOST, InfraReason.MESSAGE_LOST, InfraKind.WORKER_LOST,
                               f"task {task} is neither queued nor on a worker {since_dispatch:.0f} s after dispatch",
                               claimed_by=ev.claimed_by))
    return _confirmed(out, probe, recheck_s)


ABSENCE = (InfraReason.WORKER_LOST, InfraReason.MESSAGE_LOST)


def _confirmed(findings: list[Finding], probe: TaskProbe, recheck_s: float) -> list[Finding]:
    """Look again, a moment later, at tasks judged lost by their absence: a worker moves a message from the
    queue to its unacknowledged set in two steps, and a heartbeat may be just starting."""
    if recheck_s <= 0 or not any(f.reason in ABSENCE for f in findings):
        return findings
    time.sleep(recheck_s)

    def reappeared(f: Finding) -> bool:
        # A running task's message sits unacknowledged until its worker acks it, dead or alive: only the
        # heartbeat tells. A queued task may have been picked up meanwhile.
        found = probe.beating(f.task_id, f.claimed_by) or probe.finished(f.task_id) is not None
        return found or (f.reason is InfraReason.MESSAGE_LOST and probe.in_broker(f.task_id))
    return [f for f in findings if f.reason not in ABSENCE or not reappeared(f)]


def act(session: Session, service, finding: Finding) -> str:
    """Apply one finding (in its own transaction; the service re-checks under the PR's lock)."""
    if finding.action is WatchdogAction.RESEND:
        return service.resend(session, finding.eval_id, finding.task_id)
    if finding.action is WatchdogAction.RECOVER:
        state, result = finding.outcome
        if state == states.SUCCESS and isinstance(result, dict):
            return service.publish_result(session, result, finding.eval_id, finding.task_id)
        detail = f"{type(result).__name__}: {result}" if isinstance(result, BaseException) else str(result)
        return service.evaluation_failed(session, finding.eval_id, finding.task_id, detail)
    return service.mark_lost(session, finding.eval_id, finding.task_id, finding.reason, finding.kind,
                             finding.detail, **finding.context)
