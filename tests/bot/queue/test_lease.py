"""Red team of the delivery claim's renewal (bot/queue/lease.py) against `_failed`, on both databases the service
runs on (PostgreSQL, and SQLite embedded: the default database_url)."""
from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest

from bot.db.engine import session_scope
from bot.db.models import Delivery, aware, utcnow
from bot.queue.outbox import HANDLING


@pytest.fixture(params=["postgresql", "sqlite"])
def db_settings(request, settings, tmp_path):
    if request.param == "postgresql":
        yield settings
        return
    from bot.db import migrate
    from bot.settings import override_settings
    url = f"sqlite:///{tmp_path / 'tokengate.sqlite3'}"
    migrate.upgrade(url)
    embedded = settings.model_copy(update={"database_url": url})
    override_settings(embedded)
    yield embedded
    override_settings(settings)


def test_a_renewal_in_flight_does_not_push_back_the_retry_failed_scheduled(db_settings, monkeypatch):
    """The handler's claim is committed (its dispatch commits), a renewal has read it, then the handler raises:
    `_failed` takes the claim back and schedules the retry after its backoff (seconds). The renewal that lands
    after that must change nothing; it pushed the retry back by the whole lease (10 minutes in production)."""
    from bot.queue import lease, tasks
    monkeypatch.setattr(db_settings, "handler_lease_s", 6.0)  # a beat every 2 s; the retry's backoff is 2 s
    did = uuid.uuid4().hex
    with session_scope() as s:
        s.add(Delivery(id=did, event="ping", body=b'{"zen": "x"}', received_at=utcnow()))
    read, failed_done, renewed, took_back = threading.Event(), threading.Event(), threading.Event(), []
    real_now, real_failed, real_renew = lease.utcnow, tasks._failed, lease.renew

    def now_after_failed():  # the renewal read the claim; it writes once `_failed` has committed (or 4 s passed)
        read.set()
        failed_done.wait(4)
        return real_now()

    def failed(*args):
        out = real_failed(*args)
        failed_done.set()
        took_back.append(real_now())
        return out

    def renew(*args):
        try:
            return real_renew(*args)
        finally:
            renewed.set()

    class Raising:
        def __init__(self, _service):
            pass

        def dispatch(self, session, event, payload):
            session.commit()  # as Service._dispatch: the claim is stored with the effect
            assert read.wait(10)
            raise RuntimeError("a bug in the handler")

    monkeypatch.setattr(lease, "utcnow", now_after_failed)
    monkeypatch.setattr(lease, "renew", renew)
    monkeypatch.setattr(tasks, "_failed", failed)
    monkeypatch.setattr(tasks, "Handlers", Raising)
    monkeypatch.setattr(tasks, "Service", lambda: None)
    assert tasks._handle(did).startswith("retry: RuntimeError")
    assert renewed.wait(10)
    with session_scope() as s:
        d = s.get(Delivery, did)
        assert d.outcome is None and d.attempts == 1
        waits = (aware(d.next_attempt_at) - took_back[0]).total_seconds()
    assert waits < db_settings.handler_lease_s - 1, (
        f"retry due {waits:.1f} s after `_failed`: the renewal's lease, not the backoff")


def test_a_live_handler_is_renewed_and_a_hung_one_let_go(db_settings):
    """While its handler runs, the claim outlives its lease; a handler still running after `max_s` is taken for
    hung (a call with no timeout): its claim then lapses, and the outbox may hand the delivery out again, rather
    than the delivery being held for ever."""
    import time

    from bot.queue.lease import ClaimRenewal
    from bot.queue.outbox import claimed
    did, claim = uuid.uuid4().hex, f"{HANDLING} (claim test)"
    with session_scope() as s:
        s.add(Delivery(id=did, event="ping", body=b'{"zen": "x"}', received_at=utcnow(), outcome=claim,
                       next_attempt_at=utcnow() + timedelta(seconds=0.6)))

    def holds() -> bool:
        with session_scope() as s:
            return claimed(s.get(Delivery, did), utcnow())
    with ClaimRenewal(did, claim, lease_s=0.6, max_s=1.2):
        time.sleep(1.0)
        assert holds(), "a live handler's claim lapsed at its lease"
        time.sleep(2.0)
        assert not holds(), "a handler running past max_s still holds its delivery"
