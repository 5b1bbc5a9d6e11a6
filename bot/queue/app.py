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
    key = f"{s.broker_url}|{s.backend_url}|{s.redis_key_prefix}|{s.heartbeat_ttl_s}|{s.broker_timeout_s}"
    with _lock:
        if _configured != [key]:
            # Short socket timeouts: a web request must answer 503 within ~1 s when Redis is gone, not hang.
            # max_retries/interval_*: kombu's reconnect loop when publishing (default: ~20 s of retries) gives up
            # at once: a failed publish is the outbox's to repeat, never a request's to wait for.
            transport = {"socket_connect_timeout": s.broker_timeout_s, "socket_timeout": max(5.0, s.broker_timeout_s),
                         "max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2,
                         **({"global_keyprefix": s.redis_key_prefix} if s.redis_key_prefix else {})}
            shared.configure(s.broker_url, s.backend_url, key_prefix=s.redis_key_prefix,
                             broker_transport_options=transport, result_backend_transport_options=transport,
                             broker_connection_timeout=s.broker_timeout_s,
                             redis_socket_connect_timeout=s.broker_timeout_s,
                             **{shared.HEARTBEAT_TTL_CONF: s.heartbeat_ttl_s})
            _configured[:] = [key]
    return shared.app
