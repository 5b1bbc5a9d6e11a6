"""`POST /webhook`: cap, verify, store, answer — nothing else happens in the request (target: a few ms).

Order matters: the body is read only up to GitHub's 25 MB cap, and the signature is checked before anything
is stored. The raw body is then committed to the deliveries table (primary key = X-GitHub-Delivery) by the
outbox writer's group commit (bot/queue/intake.py) before GitHub gets its answer, so an acknowledged
delivery survives a broker or worker restart. It is not parsed here: the handle task reads it. After the
commit the publish side is asked, coalesced, to drain the outbox (bot/queue/kick.py). A row already
processed — or the same signed body under another delivery id — is a duplicate. Database unreachable, or
the broker unreachable at the last kick → 503 at once, so GitHub redelivers (the delivery is stored anyway).

The handler is a bare ASGI app, called before FastAPI's stack: no request object, no dependency injection,
no middleware, no thread hop on the way in.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from bot import metrics
from bot.db.engine import engine_for
from bot.github.signature import verify
from bot.queue import intake, kick
from bot.settings import get_settings

log = logging.getLogger(__name__)

EVENTS = {"pull_request", "issue_comment", "check_run", "installation", "installation_repositories", "ping"}
MAX_ID = 64  # the deliveries key; GitHub's ids are 36-character GUIDs
JSON_OBJECT = re.compile(rb"\s*\{")  # the one look at the body before storing it: an object, not parsed


class TooLarge(Exception):
    pass


class App(FastAPI):
    """FastAPI, except that POST /webhook goes straight to its handler: none of the middleware stack (error
    pages, telemetry, exit stacks) or route matching the dashboard needs, on the one path that must be fast."""

    intake: "Intake"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/webhook":
            await self.intake(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app() -> FastAPI:
    """The web app; further routers (dashboard pages) are added with `app.include_router`."""
    from bot.web import ops
    app = App(title="tokengate", docs_url=None, redoc_url=None, openapi_url=None)
    app.intake = Intake()
    app.router.routes.append(Route("/webhook", app.intake, methods=["POST"], name="webhook"))  # 405s, url_for
    app.include_router(ops.router)
    from bot.web.pages import router as pages  # the dashboard (issue 16)
    app.include_router(pages)
    return app


class Intake:
    """The ASGI app behind POST /webhook."""

    async def __call__(self, scope, receive, send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        status, body = await self.handle(headers, receive)
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def handle(self, headers: dict[str, str], receive) -> tuple[int, dict]:
        settings = get_settings()
        event = headers.get("x-github-event") or ""
        limit = settings.webhook_max_body_bytes
        try:
            raw = await read_capped(headers, receive, limit)
        except TooLarge:
            return answer("?", "too_large", {"error": f"body over {limit} bytes"}, 413)
        if not verify(settings.webhook_secret, raw, headers.get("x-hub-signature-256")):
            return answer(event, "unauthorized", {"error": "invalid or missing signature"}, 401)
        delivery_id = headers.get("x-github-delivery") or ""
        if not delivery_id or not event:
            return answer(event, "bad_request", {"error": "missing X-GitHub-Delivery or X-GitHub-Event"}, 400)
        if len(delivery_id) > MAX_ID or not delivery_id.isascii() or not delivery_id.isprintable():
            return answer(event, "bad_request",
                          {"error": f"X-GitHub-Delivery must be ≤ {MAX_ID} printable ASCII"}, 400)
        if event not in EVENTS:
            return answer(event, "ignored", {"status": "ignored", "event": event}, 202)
        if not JSON_OBJECT.match(raw):
            return answer(event, "bad_request", {"error": "body is not a JSON object"}, 400)
        stored = await store(settings.database_url, delivery_id, event, raw, settings.webhook_store_timeout_s)
        if stored == "db_unavailable":
            return answer(event, "db_unavailable", {"error": "database unavailable, please redeliver"}, 503)
        if stored == "duplicate":
            return answer(event, "duplicate", {"status": "duplicate", "delivery": delivery_id}, 200)
        kicker = kick.kicker()
        if kicker.healthy:
            kicker.kick()
        elif not await run_in_threadpool(kicker.kick_now):  # down (or not tried yet): find out, ≤ ~1 s
            return answer(event, "broker_unavailable", {"error": "queue unavailable, please redeliver"}, 503)
        return answer(event, "queued", {"status": "queued", "delivery": delivery_id}, 202)


def warm_up() -> None:
    """Open now what the first requests of a burst would otherwise all wait for at once: the outbox writer
    and its database connection, the kicker and its broker connection (which also learns whether the broker
    is up). Failures only log: the requests answer 503 for what is still down."""
    settings = get_settings()
    try:
        with engine_for(settings.database_url).connect():
            pass
    except Exception as exc:  # noqa: BLE001
        log.warning("web: database unreachable at startup (%s)", exc)
    intake.writer_for(settings.database_url)
    kick.kicker().kick_now()


async def read_capped(headers: dict[str, str], receive, limit: int) -> bytes:
    """The body, refused as soon as it (or its Content-Length) passes `limit`: never buffered whole."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def store(url: str, delivery_id: str, event: str, raw: bytes, timeout: float) -> str:
    """Hand the delivery to the outbox writer and wait for its commit (or give up: 503, GitHub redelivers)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()

    def resolve(outcome: str) -> None:  # the writer thread → this request's event loop
        loop.call_soon_threadsafe(lambda: done.done() or done.set_result(outcome))

    intake.writer_for(url).submit(intake.Pending(delivery_id, event, raw, resolve))
    try:
        return await asyncio.wait_for(done, timeout)
    except asyncio.TimeoutError:
        log.warning("delivery %s: not stored within %.1f s", delivery_id, timeout)
        return "db_unavailable"


def answer(event: str, outcome: str, body: dict, status: int) -> tuple[int, dict]:
    metrics.DELIVERIES.labels(event if event in EVENTS else "other", outcome).inc()
    return status, body
