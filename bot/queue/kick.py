"""Tells the publish side that the outbox holds new deliveries: one drain task for many of them.

The web app sends no handle task per delivery (~0.6 ms of Python each, on the process that must answer
GitHub within milliseconds); after a commit it asks for a drain, coalesced to at most one every
KICK_EVERY_S, and the publish worker's drain sends every due delivery (bot/queue/outbox.py). The beat drains
every outbox_interval_s as well, so a lost kick only delays a delivery, it never loses one.

Whether the last kick reached the broker also decides the answer while Redis is down: a request whose
delivery is stored but whose broker is unreachable is answered 503 (GitHub keeps it for redelivery),
within broker_timeout_s.
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

KICK_EVERY_S = 0.05  # a burst of 1000 deliveries/s costs ~20 broker messages/s, each delivery waits ≤ 50 ms more


def send_drain() -> None:
    """One drain task on the publish queue, without waiting on an unreachable broker (raises instead)."""
    from bot.queue.app import celery_app
    from bot.queue.outbox import DRAIN_TASK
    from bot.settings import get_settings
    celery_app().send_task(DRAIN_TASK, queue="publish", retry=False, ignore_result=True,
                           expires=get_settings().outbox_interval_s)


class DrainKicker:
    """A background thread sending coalesced drain kicks; `healthy` is what the last attempt found."""

    def __init__(self, sender=send_drain):
        self._send = sender
        self._wake = threading.Event()
        self.healthy: bool | None = None  # None: no kick tried yet
        threading.Thread(target=self._run, name="outbox-kicker", daemon=True).start()

    def kick(self) -> None:
        """Ask for a drain soon (returns at once)."""
        self._wake.set()

    def kick_now(self) -> bool:
        """Send a drain now (blocks ≤ broker_timeout_s): for requests while the broker is down or unknown."""
        try:
            self._send()
        except Exception as exc:  # noqa: BLE001 - any failure: the broker is unreachable for this request
            if self.healthy is not False:
                log.warning("outbox: broker unreachable (%s: %s)", type(exc).__name__, exc)
            self.healthy = False
            return False
        self.healthy = True
        return True

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()  # deliveries committed after this are covered by the next kick
            self.kick_now()
            time.sleep(KICK_EVERY_S)


_kicker: list[DrainKicker] = []
_lock = threading.Lock()


def kicker() -> DrainKicker:
    with _lock:
        if not _kicker:
            _kicker.append(DrainKicker())
        return _kicker[0]
