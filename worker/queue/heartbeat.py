"""Liveness of running evaluations: a Redis key per task, refreshed by a thread while the task runs.

The key expires `TTL_S` after the last refresh, so a worker that vanished (killed, OOM, host lost)
stops looking alive within that time, whatever its pool. The bot's watchdog reads the keys; this
side only needs the broker (no credentials). Each value is stamped and signed with the worker's own key
(worker/queue/auth.py beat_value): another GPU worker can write the key but cannot keep a dead attempt
looking alive.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from worker.queue import auth

log = logging.getLogger(__name__)

INTERVAL_S = 10.0
TTL_S = 45.0  # several missed refreshes before a task counts as gone


def key(prefix: str, task_id: str) -> str:
    return f"{prefix}tokengate:alive:{task_id}"


def broker_redis(celery_app):
    """(client, key prefix) for the app's broker, or (None, "") when the broker is not Redis."""
    url = celery_app.conf.broker_url or ""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None, ""
    import redis
    prefix = (celery_app.conf.broker_transport_options or {}).get("global_keyprefix", "")
    return redis.Redis.from_url(url, socket_timeout=5), prefix


class Heartbeat:
    """Refreshes `key(prefix, task_id)` every `interval` seconds until stopped (then deletes it)."""

    def __init__(self, client, prefix: str, task_id: str, value: str | Callable[[], str],
                 interval: float = INTERVAL_S, ttl: float = TTL_S):
        self.client, self.key, self.value = client, key(prefix, task_id), value
        self.interval, self.ttl = interval, ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{task_id}", daemon=True)

    def start(self) -> "Heartbeat":
        self._beat()  # alive before the task body runs
        self._thread.start()
        return self

    def _beat(self) -> None:
        try:
            value = self.value() if callable(self.value) else self.value  # a fresh stamp each beat
            self.client.set(self.key, value, px=max(1, int(self.ttl * 1000)))
        except Exception:  # noqa: BLE001 - a broker hiccup must not fail the evaluation
            log.warning("heartbeat %s: could not refresh", self.key, exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._beat()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.client.delete(self.key)
        except Exception:  # noqa: BLE001
            log.warning("heartbeat %s: could not delete", self.key, exc_info=True)


def is_alive(client, prefix: str, task_id: str, valid: Callable[[bytes | None], bool] | None = None) -> bool:
    """The key exists (and, with `valid`, its value passes it: worker/queue/auth.py beat_valid)."""
    if valid is None:
        return bool(client.exists(key(prefix, task_id)))
    return valid(client.get(key(prefix, task_id)))


def signed_value(task_id: str, hostname: str) -> Callable[[], str]:
    return lambda: auth.beat_value(task_id, hostname, time.time())
