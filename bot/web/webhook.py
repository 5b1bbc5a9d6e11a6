"""`POST /webhook`: verify, dedupe, queue — nothing else happens in the request (target: a few ms).

Order matters: the signature is checked before anything is stored; the delivery row (primary
key = X-GitHub-Delivery) is the dedupe, so a redelivery never queues twice; if the queue is
unreachable the row is removed again so GitHub's redelivery can succeed later.
"""
from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from sqlalchemy import delete, text
from sqlalchemy.exc import IntegrityError

from bot.db.engine import session_scope
from bot.db.models import Delivery
from bot.settings import get_settings
from bot.github.signature import verify

log = logging.getLogger(__name__)

HANDLE_TASK = "tokengate.handle_delivery"
EVENTS = {"pull_request", "issue_comment", "check_run", "installation", "installation_repositories", "ping"}


def create_app() -> FastAPI:
    app = FastAPI(title="tokengate", docs_url=None, redoc_url=None, openapi_url=None)
    from bot.web.pages import router as pages  # the dashboard (issue 16)
    app.include_router(pages)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/webhook")
    async def webhook(request: Request) -> JSONResponse:
        body = await request.body()
        # Database and broker calls block: keep them off the event loop.
        return await run_in_threadpool(receive, body, request.headers)

    return app


def receive(body: bytes, headers) -> JSONResponse:
    settings = get_settings()
    if not verify(settings.webhook_secret, body, headers.get("x-hub-signature-256")):
        return JSONResponse({"error": "invalid or missing signature"}, status_code=401)
    delivery_id = headers.get("x-github-delivery")
    event = headers.get("x-github-event")
    if not delivery_id or not event:
        return JSONResponse({"error": "missing X-GitHub-Delivery or X-GitHub-Event"}, status_code=400)
    try:
        payload = json.loads(body)
    except ValueError:
        return JSONResponse({"error": "body is not JSON"}, status_code=400)
    if not isinstance(payload, dict):
        return JSONResponse({"error": "body is not a JSON object"}, status_code=400)
    action = payload.get("action")
    if event not in EVENTS:
        return JSONResponse({"status": "ignored", "event": event}, status_code=202)
    try:
        with session_scope() as session:
            if session.get_bind().dialect.name == "postgresql":
                # Don't wait for the WAL flush: a delivery lost in a crash is redelivered by GitHub.
                session.execute(text("SET LOCAL synchronous_commit TO OFF"))
            session.add(Delivery(id=delivery_id[:64], event=event, action=action))
    except IntegrityError:
        return JSONResponse({"status": "duplicate", "delivery": delivery_id}, status_code=200)
    from bot.queue.app import celery_app
    try:
        celery_app().send_task(HANDLE_TASK, args=[delivery_id, event, payload], queue="publish",
                               task_id=f"delivery-{delivery_id}")
    except Exception:
        log.exception("could not queue delivery %s", delivery_id)
        with session_scope() as session:
            session.execute(delete(Delivery).where(Delivery.id == delivery_id))
        return JSONResponse({"error": "queue unavailable, please redeliver"}, status_code=503)
    return JSONResponse({"status": "queued", "delivery": delivery_id}, status_code=202)
