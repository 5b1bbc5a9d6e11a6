"""Queue position and ETA, from the database (the source of truth for what is waiting)."""
from __future__ import annotations

import statistics

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from bot.enums import EvalState
from bot.db.models import Evaluation
from bot.render import QueueInfo

RECENT = 20  # finished evaluations used for the ETA


def recent_median_duration(session: Session) -> float | None:
    rows = session.scalars(
        select(Evaluation.duration_s).where(Evaluation.state == EvalState.DONE, Evaluation.duration_s.is_not(None))
        .order_by(Evaluation.finished_at.desc()).limit(RECENT)).all()
    return statistics.median(rows) if rows else None


def queue_info(session: Session, ev: Evaluation, gpu_workers: int) -> QueueInfo | None:
    median = recent_median_duration(session)
    running = session.scalar(select(func.count()).where(Evaluation.state == EvalState.RUNNING)) or 0
    if ev.state == EvalState.RUNNING:
        eta = None
        if median is not None and ev.started_at is not None:
            from bot.db.models import aware, utcnow
            eta = max(median - (utcnow() - aware(ev.started_at)).total_seconds(), 0.0)
        return QueueInfo(position=None, ahead_running=running, eta_s=eta, median_duration_s=median)
    if ev.state != EvalState.QUEUED:
        return None
    ahead = session.scalar(select(func.count()).where(Evaluation.state == EvalState.QUEUED,
                                                      Evaluation.id < ev.id)) or 0
    position = ahead + 1
    eta = None
    if median is not None:
        # Everything ahead (and the running ones) drains over gpu_workers; then this one runs.
        waves = (ahead + running) / gpu_workers
        eta = (waves + 1) * median
    return QueueInfo(position=position, ahead_running=running, eta_s=eta, median_duration_s=median)
