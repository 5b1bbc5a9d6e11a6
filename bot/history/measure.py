"""Measure commits of main on the GPU queue: after each merge, and at bisection midpoints.

Same queue path as a PR's evaluation (`tokengate.evaluate` on `gpu`, the result linked back to a
`publish` task) but no pull request owns the job: it carries `history_id`, not `eval_id`, so the
PR side (check runs, sticky comment, watchdog) never sees it.
"""
from __future__ import annotations

import logging
import uuid

from celery import Celery, signature
from sqlalchemy import select
from sqlalchemy.orm import Session

from bot.db.models import HistoryPoint, MainMeasurement, PullRequest, Repository, utcnow
from bot.history import commits
from bot.settings import Settings
from worker.queue.app import EVALUATE_TASK, GPU_QUEUE, PUBLISH_QUEUE
from worker.records import EvalResult, Verdict

log = logging.getLogger(__name__)

RESULT_TASK = "tokengate.history_result"
FAILURE_TASK = "tokengate.history_failed"
EVALUATE = EVALUATE_TASK  # the gpu task's name (tests point it at a fake that reads the tree)
UNSENT = "unsent"  # stored, its GPU job not (yet) sent: the broker or the mirror was away


def peak_memory(result: EvalResult) -> tuple[int | None, str | None]:
    """The head revision's peak memory: NVML's GPU bytes when measured, else its process max RSS."""
    head = (result.receipt.get("processes") or {}).get("head") or {}
    if head.get("peak_gpu_memory_bytes") is not None:
        return int(head["peak_gpu_memory_bytes"]), "gpu"
    if head.get("max_rss_bytes") is not None:
        return int(head["max_rss_bytes"]), "rss"
    return None, None


def queue_measurement(session: Session, settings: Settings, celery: Celery, repo: Repository, *, kind: str,
                      sha: str, base_sha: str, pull_request: PullRequest | None = None,
                      change_point_id: int | None = None, merged_at=None) -> MainMeasurement:
    m = MainMeasurement(repository_id=repo.id, kind=kind, sha=sha, base_sha=base_sha,
                        pull_request_id=pull_request.id if pull_request else None, change_point_id=change_point_id,
                        state="queued" if base_sha else UNSENT, profile=settings.history_profile or settings.eval.profile,
                        merged_at=merged_at, celery_task_id=str(uuid.uuid4()))
    session.add(m)
    session.flush()
    if base_sha:
        send(session, settings, celery, repo, m)
    return m


def send(session: Session, settings: Settings, celery: Celery, repo: Repository, m: MainMeasurement) -> bool:
    """Commit the row, then send its GPU job (the result may come back before this session would otherwise
    commit). A send the broker refuses leaves the row UNSENT, committed: `resend_unsent` (a beat) and a
    redelivered merge webhook send it again. Nothing is raised: the caller's work (a PR's close, a landed
    result) stands without it."""
    job = {"repo_url": repo.clone_url, "repo_full_name": repo.full_name, "pr_number": None,
           "base_ref": m.base_sha, "head_ref": m.sha, "base_sha": m.base_sha, "head_sha": m.sha, "profile": m.profile,
           "models": list(settings.models) or None, "attempt": 1, "history_id": m.id,
           "settings": settings.eval.model_dump(mode="json")}
    task_id, m.state = m.celery_task_id, "queued"
    session.commit()
    try:
        celery.send_task(EVALUATE, args=[job], task_id=task_id, queue=GPU_QUEUE,
                         link=signature(RESULT_TASK, args=[m.id, task_id], queue=PUBLISH_QUEUE, app=celery),
                         link_error=signature(FAILURE_TASK, args=[m.id, task_id], queue=PUBLISH_QUEUE, app=celery))
    except Exception as exc:  # noqa: BLE001 - the broker is away: sent again later
        log.warning("main measurement %s: not sent (%s); sent again later", m.id, exc)
        m.state, m.detail = UNSENT, f"not sent: {type(exc).__name__}: {exc}"[:2000]
        session.commit()
        return False
    return True


def resend(session: Session, settings: Settings, celery: Celery, m: MainMeasurement) -> bool:
    """An UNSENT measurement: its base read from the mirror where it was not known yet, then sent."""
    repo = m.repository
    if not m.base_sha:
        try:
            parent = commits.first_parent(repo.clone_url, m.sha)
        except commits.GitError as exc:
            m.detail = f"parent not read: {exc}"[:2000]
            session.commit()
            return False
        if parent is None:  # the root commit: nothing to measure it against
            m.state, m.detail, m.finished_at = "failed", "the root commit has no parent to measure against", utcnow()
            session.commit()
            return False
        m.base_sha = parent
    return send(session, settings, celery, repo, m)


def resend_unsent(session: Session, settings: Settings, celery: Celery) -> list[str]:
    """The beat: every UNSENT main measurement sent again (the broker or GitHub was away)."""
    out = []
    for m_id in list(session.scalars(select(MainMeasurement.id).where(MainMeasurement.state == UNSENT)
                                     .order_by(MainMeasurement.id))):
        m = session.get(MainMeasurement, m_id, with_for_update=True, populate_existing=True)
        if m is not None and m.state == UNSENT:
            out.append(f"main measurement {m_id}: {'sent' if resend(session, settings, celery, m) else 'not yet'}")
    return out


def on_main_merged(session: Session, settings: Settings, celery: Celery, repo: Repository,
                   pr: PullRequest | None, merge_sha: str, merged_at=None) -> MainMeasurement | None:
    """The hook: a PR was merged into the default branch → measure the merge commit against its parent
    (once per commit; a redelivered webhook finds the row, and sends it if it was never sent). When the mirror
    cannot be read (GitHub away), the row is stored UNSENT and the beat reads its parent later: the merge is
    never skipped, and the PR's close does not wait for it."""
    if not settings.history_enabled or not repo.clone_url or not merge_sha:
        return None
    existing = session.scalar(select(MainMeasurement).where(MainMeasurement.repository_id == repo.id,
                                                            MainMeasurement.kind == "merge",
                                                            MainMeasurement.sha == merge_sha))
    if existing is not None:
        existing = session.get(MainMeasurement, existing.id, with_for_update=True, populate_existing=True)
        if existing.state == UNSENT:  # read under its lock: the beat may be sending it right now
            resend(session, settings, celery, existing)
        return existing
    try:
        parent = commits.first_parent(repo.clone_url, merge_sha)
    except commits.GitError as exc:
        log.warning("main measurement of %s: parent not read (%s); the beat reads it again", merge_sha[:7], exc)
        parent = ""
    else:
        if parent is None:
            return None  # the root commit
    return queue_measurement(session, settings, celery, repo, kind="merge", sha=merge_sha, base_sha=parent,
                             pull_request=pr, merged_at=merged_at or utcnow())


def store_result(m: MainMeasurement, result: EvalResult) -> None:
    m.result = result.to_dict()
    m.verdict = result.verdict.value
    m.duration_s = result.duration_s
    m.finished_at = utcnow()
    if result.verdict in (Verdict.INFRA, Verdict.BUILD_FAILED):
        m.state, m.detail = "failed", result.summary
        return
    m.state = "done"
    m.peak_memory_bytes, m.memory_kind = peak_memory(result)
    m.points = [HistoryPoint(repository_id=m.repository_id, sha=m.sha, model=g.model, gate=g.gate, metric=g.metric,
                             tok_s=g.head_median, base_tok_s=g.base_median, rel_change=g.rel_change,
                             significant=g.significant, reason=g.reason) for g in result.gates]


def accept(session: Session, measurement_id: int, task_id: str | None, result_dict: dict | None,
           failure: str | None = None) -> MainMeasurement | str:
    """Record what came back (a result, or the task's failure); a string says why it was ignored."""
    m = session.get(MainMeasurement, measurement_id, with_for_update=True, populate_existing=True)
    if m is None:
        return f"main measurement {measurement_id} unknown"
    if m.state not in ("queued", "running", UNSENT):  # UNSENT: a send whose answer was lost did reach the broker
        return f"main measurement {measurement_id} is {m.state}: ignored"
    if task_id is not None and task_id != m.celery_task_id:
        return f"main measurement {measurement_id}: stale task {task_id} ignored"
    if failure is not None:
        m.state, m.detail, m.finished_at = "failed", failure[:2000], utcnow()
        return m
    try:
        result = EvalResult.from_dict(result_dict or {})
    except (KeyError, TypeError, ValueError) as exc:
        m.state, m.detail, m.finished_at = "failed", f"malformed result: {type(exc).__name__}: {exc}", utcnow()
        return m
    if result.head_sha != m.sha or result.base_sha != m.base_sha:
        # e.g. the worker's result cache, keyed without the base, answered for another base
        m.state, m.finished_at = "failed", utcnow()
        m.detail = (f"asked {m.base_sha[:7]}..{m.sha[:7]}, got {result.base_sha[:7]}..{result.head_sha[:7]}")
        return m
    store_result(m, result)
    return m
