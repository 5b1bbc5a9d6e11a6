"""The bot side's handle on the shared Celery app, configured from the settings on first use."""
from __future__ import annotations

import threading

from celery import Celery

from worker.queue import app as shared

_lock = threading.Lock()
_configured: list[str] = []


def celery_app() -> Celery:
    from bot.settings import get_settings
    s = get_settings()
    key = f"{s.broker_url}|{s.backend_url}|{s.redis_key_prefix}|{s.heartbeat_ttl_s}"
    with _lock:
        if _configured != [key]:
            shared.configure(s.broker_url, s.backend_url, key_prefix=s.redis_key_prefix,
                             **{shared.HEARTBEAT_TTL_CONF: s.heartbeat_ttl_s})
            _configured[:] = [key]
    return shared.app
