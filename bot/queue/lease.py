"""A delivery handler's claim, renewed while the handler runs.

The claim (bot/queue/tasks.py `_claim`) lapses after `handler_lease_s` so that a handler that died is handled
again. A live handler slower than that (GitHub answering slowly, its calls retried) must not lose it: the outbox
would hand the delivery to a second handler while the first still runs. A heartbeat thread extends the claim
while the handler lives; a killed process stops renewing, and its claim lapses as before.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from sqlalchemy import select, update

from bot.db.engine import session_scope
from bot.db.models import Delivery, utcnow

log = logging.getLogger(__name__)


def renew(delivery_id: str, claim: str, lease_s: float) -> bool:
    """Extend `claim` on the delivery by `lease_s` from now, if the delivery still carries it (committed). A row the
    handler itself has locked is skipped (its own transaction holds the claim; waiting could deadlock it). The write
    checks the claim again itself: SQLite locks no row, and `_failed` (or the handler's end) may commit between the
    read and the write, whose new lease pushed back the retry `_failed` had scheduled."""
    carries = (Delivery.id == delivery_id, Delivery.outcome == claim)
    with session_scope() as session:
        if session.scalar(select(Delivery.id).where(*carries).with_for_update(skip_locked=True)) is None:
            return False
        until = utcnow() + timedelta(seconds=lease_s)
        return session.execute(update(Delivery).where(*carries).values(next_attempt_at=until)
                               .execution_options(synchronize_session=False)).rowcount == 1


class ClaimRenewal:
    """`with ClaimRenewal(delivery_id, claim, lease_s, max_s):` renews the claim every third of the lease meanwhile,
    for `max_s` at most: past that the handler is taken for hung, and its claim lapses a lease later."""

    def __init__(self, delivery_id: str, claim: str, lease_s: float, max_s: float):
        self.delivery_id, self.claim, self.lease_s, self.max_s = delivery_id, claim, lease_s, max_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"claim-{delivery_id[:12]}", daemon=True)

    def __enter__(self) -> ClaimRenewal:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        # Not waited for long: on SQLite a renewal waits for the handler's own open write, which commits only after
        # this. A renewal that lands late finds the delivery's outcome no longer its claim and changes nothing.
        self._thread.join(timeout=2)

    def _beat(self) -> None:
        until = time.monotonic() + self.max_s
        while not self._stop.wait(self.lease_s / 3):
            if time.monotonic() > until:
                log.warning("delivery %s: handler still running after %.0f s: its claim is left to lapse",
                            self.delivery_id, self.max_s)
                return
            try:
                renew(self.delivery_id, self.claim, self.lease_s)
            except Exception:  # noqa: BLE001 - the database away: the next beat tries again, the claim may lapse
                log.warning("delivery %s: claim not renewed", self.delivery_id, exc_info=True)
