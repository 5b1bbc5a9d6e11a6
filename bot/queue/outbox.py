"""The delivery outbox: the deliveries table holds every accepted payload until its effect is stored.

The web request stores the raw body and asks for a drain (bot/queue/kick.py); the drain — asked for, or the
publish worker's beat — sends a handle task for whatever is due: just stored, never sent because the broker
was down, lost in a broker restart, or past its retry backoff.
The handle task takes only the delivery id and reads the payload from the database: a message someone
pushed onto the broker by hand names no stored, signed delivery and does nothing.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from bot.db.models import Delivery, aware, utcnow
from bot.settings import Settings

log = logging.getLogger(__name__)

HANDLE_TASK = "tokengate.handle_delivery"
DRAIN_TASK = "tokengate.drain_outbox"
DRAIN_BATCH = 500
HANDLING = "being handled"  # the outcome of a delivery whose handler holds its claim (bot/queue/tasks.py `_claim`)
# session.info key: the delivery whose handler runs in that session (Service.request_evaluation keys its evaluations)
HANDLING_DELIVERY = "handling_delivery"


class BadBody(ValueError):
    """A signed body that is not a JSON object: stored, never handled."""


def payload_of(delivery: Delivery) -> dict:
    """The delivery's payload, parsed from the raw body the web request stored (or a legacy parsed row)."""
    if delivery.body is None:
        return delivery.payload or {}
    try:
        payload = json.loads(delivery.body)
    except ValueError as exc:
        raise BadBody(f"body is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadBody("body is not a JSON object")
    # A NUL can only be in the payload as the JSON escape \u0000: walk it only then.
    return scrub(payload) if b"\\u0000" in delivery.body else payload


def scrub(value):
    """NUL characters (PostgreSQL text refuses them) → U+FFFD, everywhere in the payload."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def claimed(delivery: Delivery, now: datetime) -> bool:
    """A handler's claim on the delivery (bot/queue/tasks.py `_claim`) has not lapsed yet."""
    until = aware(delivery.next_attempt_at)
    return holds_claim(delivery) and until is not None and until > now


def holds_claim(delivery: Delivery) -> bool:
    """The delivery carries a handler's claim, lapsed or not."""
    return (delivery.outcome or "").startswith(HANDLING)


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
        if holds_claim(d):
            d.outcome = None  # due: the claim has lapsed (its handler died), and it must not hold the new one off
        d.enqueued_at = now
        d.next_attempt_at = now + timedelta(seconds=settings.outbox_redrive_after_s)
        sent.append(d.id)
    return sent


def requeue(session: Session, ids: list[str] | None, failed_only: bool = False) -> list[str]:
    """Operators: make deliveries due now again (also those given up on); returns the ids sent. A delivery whose
    handler holds its claim is left to it: made due, it was handed out again beside the live handler (which its
    claim's lapse does anyway, should that handler have died)."""
    now = utcnow()
    q = select(Delivery).where(Delivery.processed_at.is_(None))
    if ids:
        q = q.where(Delivery.id.in_(ids))
    if failed_only:
        q = q.where(Delivery.failed_at.is_not(None))
    out = []
    for d in session.scalars(q.with_for_update()):
        if claimed(d, now):
            log.warning("delivery %s: %s until %s: not requeued", d.id, d.outcome, d.next_attempt_at)
            continue
        d.failed_at = None
        d.attempts = 0
        d.next_attempt_at = None
        out.append(d.id)
    session.commit()
    for delivery_id in out:
        send(delivery_id)
    return out
