"""Publish-side Celery tasks of main's history (registered on the shared app when imported)."""
from __future__ import annotations

import logging

from sqlalchemy import select

from bot.db.engine import session_scope
from bot.db.models import ChangePoint, MainMeasurement, Repository
from bot.history import job, measure
from worker.queue.app import app

log = logging.getLogger(__name__)

RESEND_TASK = "tokengate.resend_unsent_measurements"
REFRESH_TASK = "tokengate.refresh_stale_change_point_posts"


def _gh_repo(repo):
    from bot.github.client import get_github_app
    if repo.installation_id is None:
        raise ValueError(f"{repo.full_name}: no installation on record, cannot authenticate")
    return get_github_app().client(repo.installation_id).get_repo(repo.full_name)


def _land(measurement_id: int, task_id: str | None, result: dict | None, failure: str | None) -> str:
    from bot.queue.app import celery_app
    from bot.settings import get_settings
    with session_scope() as session:
        # Lock order: repository, then measurement (the history rows' foreign keys share-lock the repository,
        # and the change-point scan takes it for update: one scan per repository at a time).
        repo_id = session.scalar(select(MainMeasurement.repository_id).where(MainMeasurement.id == measurement_id))
        if repo_id is not None:
            session.get(Repository, repo_id, with_for_update=True, populate_existing=True)
        m = measure.accept(session, measurement_id, task_id, result, failure)
        if isinstance(m, str):
            m = _step_to_retake(session, measurement_id, m)
            if isinstance(m, str):
                return m
        else:
            # Stored before the scan: a post GitHub refuses (or any failure after this) must not take the point
            # out of main's history with it. Then the locks again, in the same order.
            session.commit()
            session.get(Repository, repo_id, with_for_update=True, populate_existing=True)
            m = session.get(MainMeasurement, measurement_id, with_for_update=True, populate_existing=True)
        outcome = job.after_measurement(session, get_settings(), celery_app(), _gh_repo, m)
    log.info("main measurement %s: %s", measurement_id, outcome)
    return outcome


# Any failure is retried (GitHub down while a change point is posted, PostgreSQL restarting): the measurement itself
# is committed before the scan (`_land`), and a retry takes the step that failed again (`_step_to_retake`).
@app.task(name=measure.RESULT_TASK, autoretry_for=(Exception,), retry_backoff=True, max_retries=5)
def history_result(result: dict, measurement_id: int, task_id: str | None = None) -> str:
    """A main measurement lands only when a GPU worker's own key signed it for this task (as a PR's result
    must: bot/service.py); the broker URL alone plots nothing."""
    from bot.service import Service
    from bot.settings import get_settings
    from worker.queue.tasks import RESULT_AUTH
    worker = Service(get_settings()).authenticate(result, None, task_id)
    if worker is None:
        log.warning("main measurement %s: result without a valid worker signature ignored", measurement_id)
        return f"main measurement {measurement_id}: unsigned or forged result ignored"
    body = {k: v for k, v in result.items() if k != RESULT_AUTH}
    return _land(measurement_id, task_id, body, None)


def _step_to_retake(session, measurement_id: int, why: str):
    """A measurement that landed but whose next step failed after (this task retried): the merge's scan again (known
    change points are not posted twice), or the bisection's step again when it was not taken; else `why`. A step
    taken either ends the bisection (named, unresolved) or queues its next measurement, so "still bisecting and
    nothing queued for it since" is a step not taken."""
    m = session.get(MainMeasurement, measurement_id)
    if m is None or m.state != "done":
        return why
    if m.kind == "merge":
        return m
    cp = session.get(ChangePoint, m.change_point_id, with_for_update=True) if m.change_point_id else None
    later = session.scalar(select(MainMeasurement.id).where(MainMeasurement.change_point_id == m.change_point_id,
                                                            MainMeasurement.id > m.id).limit(1))
    taken = cp is None or cp.state != "bisecting" or later is not None
    return why if taken else m


@app.task(name=RESEND_TASK)
def resend_unsent_measurements() -> list[str]:
    """Main measurements stored but never sent (the broker or the mirror was away): sent now (beat)."""
    from bot.queue.app import celery_app
    from bot.settings import get_settings
    with session_scope() as session:
        return measure.resend_unsent(session, get_settings(), celery_app())


@app.task(name=REFRESH_TASK)
def refresh_stale_change_point_posts() -> list[str]:
    """Change-point posts whose last edit GitHub refused, edited again (beat)."""
    from bot.settings import get_settings
    with session_scope() as session:
        return job.refresh_stale_posts(session, get_settings(), _gh_repo)


@app.task(name=measure.FAILURE_TASK)
def history_failed(*args) -> str:
    """Errback: (failed_task_id, measurement_id, task_id) via the broker, or (request, exc, tb, …) in-process."""
    *head, measurement_id, task_id = args
    detail = "the evaluation task failed"
    if len(head) >= 2 and isinstance(head[1], BaseException):
        detail = f"{type(head[1]).__name__}: {head[1]}"
    return _land(measurement_id, task_id, None, detail)
