"""Operator endpoints: /healthz (the process answers), /readyz (database and broker reachable), /metrics."""
from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

log = logging.getLogger(__name__)
router = APIRouter()


def check_database() -> str | None:
    from bot.db.engine import get_engine
    try:
        with get_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return None


def check_broker() -> str | None:
    from bot.queue.app import celery_app
    try:
        with celery_app().connection_for_write() as conn:
            conn.ensure_connection(max_retries=0, timeout=1)
            conn.default_channel.client.ping()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None


@router.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
def readyz() -> JSONResponse:
    problems = {name: why for name, why in (("database", check_database()), ("broker", check_broker())) if why}
    if problems:
        return JSONResponse({"status": "unavailable", **problems}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
def metrics() -> Response:
    from bot import metrics as m
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)
