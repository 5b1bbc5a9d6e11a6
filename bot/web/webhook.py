"""`POST /webhook`: cap, verify, store, queue — nothing else happens in the request (target: a few ms).

Order matters: the body is read only up to GitHub's 25 MB cap, and the signature is checked before anything
is stored. The delivery row (primary key = X-GitHub-Delivery, payload included) is committed before GitHub
gets its answer, so an acknowledged delivery survives a broker or worker restart (the outbox, bot/queue/
outbox.py). A row already processed — or the same signed body under another delivery id — is a duplicate.
Database or broker unreachable → 503 at once, so GitHub redelivers.
"""
from __future__ import annotations

import hashlib
import json
import logging
from datetime import timedelta

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from bot import metrics
from bot.db.engine import session_scope
from bot.db.models import Delivery, utcnow
from bot.github.signature import verify
from bot.queue.outbox import HANDLE_TASK, send  # noqa: F401  (HANDLE_TASK re-exported)
from bot.settings import get_settings

log = logging.getLogger(__name__)

EVENTS = {"pull_request", "issue_comment", "check_run", "installation", "installation_repositories", "ping"}
MAX_ID = 64  # the deliveries key; GitHub's ids are 36-character GUIDs


class TooLarge(Exception):
    pass


def create_app() -> FastAPI:
    """The web app; further routers (dashboard pages) are added with `app.include_router`."""
    from bot.web import ops
    app = FastAPI(title="tokengate", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(ops.router)
    from bot.web.pages import router as pages  # the dashboard (issue 16)
    app.include_router(pages)

    @app.post("/webhook")
    async def webhook(request: Request) -> JSONResponse:
        limit = get_settings().webhook_max_body_bytes
        try:
            body = await read_capped(request, limit)
        except TooLarge:
            return answer("?", "too_large", {"error": f"body over {limit} bytes"}, 413)
        # Database and broker calls block: keep them off the event loop.
        return await run_in_threadpool(receive, body, request.headers)

    return app


async def read_capped(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it (or its Content-Length) passes `limit`: never buffered whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def answer(event: str, outcome: str, body: dict, status: int) -> JSONResponse:
    metrics.DELIVERIES.labels(event if event in EVENTS else "other", outcome).inc()
    return JSONResponse(body, status_code=status)


def scrub(value):
    """NUL characters (PostgreSQL text refuses them) → U+FFFD, everywhere in the payload."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def receive(body: bytes, headers) -> JSONResponse:
    settings = get_settings()
    event = headers.get("x-github-event") or ""
    if not verify(settings.webhook_secret, body, headers.get("x-hub-signature-256")):
        return answer(event, "unauthorized", {"error": "invalid or missing signature"}, 401)
    delivery_id = headers.get("x-github-delivery") or ""
    if not delivery_id or not event:
        return answer(event, "bad_request", {"error": "missing X-GitHub-Delivery or X-GitHub-Event"}, 400)
    if len(delivery_id) > MAX_ID or not delivery_id.isascii() or not delivery_id.isprintable():
        return answer(event, "bad_request", {"error": f"X-GitHub-Delivery must be ≤ {MAX_ID} printable ASCII"},
                      400)
    try:
        payload = json.loads(body)
    except ValueError:
        return answer(event, "bad_request", {"error": "body is not JSON"}, 400)
    if not isinstance(payload, dict):
        return answer(event, "bad_request", {"error": "body is not a JSON object"}, 400)
    if event not in EVENTS:
        return answer(event, "ignored", {"status": "ignored", "event": event}, 202)
    action = payload.get("action")
    action = scrub(action)[:64] if isinstance(action, str) else None
    digest = hashlib.sha256(body).hexdigest()
    try:
        with session_scope() as session:
            now = utcnow()
            # A NUL can only be in the payload as the JSON escape \u0000: walk it only then.
            clean = scrub(payload) if b"\\u0000" in body else payload
            session.add(Delivery(id=delivery_id, event=event, action=action, payload=clean,
                                 body_sha256=digest, received_at=now,
                                 next_attempt_at=now + timedelta(seconds=settings.outbox_redrive_after_s)))
        stored = "queued"
    except IntegrityError:
        try:
            stored = _known(delivery_id, digest)
        except SQLAlchemyError:
            log.exception("delivery %s: database unavailable", delivery_id)
            return answer(event, "db_unavailable", {"error": "database unavailable, please redeliver"}, 503)
        if stored != "queued":
            return answer(event, "duplicate", {"status": "duplicate", "delivery": delivery_id}, 200)
    except SQLAlchemyError:
        log.exception("delivery %s: database unavailable", delivery_id)
        return answer(event, "db_unavailable", {"error": "database unavailable, please redeliver"}, 503)
    try:
        send(delivery_id)
    except Exception:  # noqa: BLE001 - stored: the outbox sends it once the broker is back
        log.exception("delivery %s: broker unavailable", delivery_id)
        return answer(event, "broker_unavailable", {"error": "queue unavailable, please redeliver"}, 503)
    return answer(event, "queued", {"status": "queued", "delivery": delivery_id}, 202)


def _known(delivery_id: str, digest: str) -> str:
    """'queued' when GitHub redelivers one we stored but have not processed yet (queue it again),
    else 'duplicate' (processed, given up on, or the same body under a new id: a replay)."""
    with session_scope() as session:
        rows = session.scalars(select(Delivery).where(or_(Delivery.id == delivery_id,
                                                          Delivery.body_sha256 == digest))).all()
    same = [d for d in rows if d.id == delivery_id]
    if same and same[0].processed_at is None and same[0].failed_at is None and same[0].body_sha256 == digest:
        return "queued"
    return "duplicate"
