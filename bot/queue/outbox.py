"""The delivery outbox: the deliveries table holds every accepted payload until its effect is stored.

The web request sends the handle task once (fast path); the publish worker's beat sends again whatever is
due — never sent because the broker was down, lost in a broker restart, or waiting for its retry backoff.
The handle task takes only the delivery id and reads the payload from the database: a message someone
pushed onto the broker by hand names no stored, signed delivery and does nothing.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from bot.db.models import Delivery, utcnow
from bot.settings import Settings

log = logging.getLogger(__name__)

HANDLE_TASK = "tokengate.handle_delivery"
DRAIN_TASK = "tokengate.drain_outbox"
DRAIN_BATCH = 500


def send(delivery_id: str) -> None:
    """Queue the handle task now, without waiting on an unreachable broker (raises instead)."""
    from bot.queue.app import celery_app
    # ignore_result: no subscription to a result channel (that alone waits ~20 s on a dead Redis).
    celery_app().send_task(HANDLE_TASK, args=[delivery_id], queue="publish", retry=False, ignore_result=True)


def due(session: Session, now: datetime, limit: int = DRAIN_BATCH) -> list[Delivery]:
    return list(session.scalars(
        select(Delivery).where(Delivery.processed_at.is_(None), Delivery.failed_at.is_(None),
                               or_(Delivery.next_attempt_at.is_(None), Delivery.next_attempt_at <= now))
        .order_by(Delivery.received_at).limit(limit).with_for_update(skip_locked=True)))


def drain(session: Session, settings: Settings, now: datetime | None = None) -> list[str]:
    """Send every due delivery again; it becomes due again `outbox_redrive_after_s` later unless processed."""
    now = now or utcnow()
    sent = []
    for d in due(session, now):
        send(d.id)
        d.enqueued_at = now
        d.next_attempt_at = now + timedelta(seconds=settings.outbox_redrive_after_s)
        sent.append(d.id)
    return sent


def requeue(session: Session, ids: list[str] | None, failed_only: bool = False) -> list[str]:
    """Operators: make deliveries due now again (also those given up on); returns the ids sent."""
    q = select(Delivery).where(Delivery.processed_at.is_(None))
    if ids:
        q = q.where(Delivery.id.in_(ids))
    if failed_only:
        q = q.where(Delivery.failed_at.is_not(None))
    out = []
    for d in session.scalars(q.with_for_update()):
        d.failed_at = None
        d.attempts = 0
        d.next_attempt_at = None
        out.append(d.id)
    session.commit()
    for delivery_id in out:
        send(delivery_id)
    return out
