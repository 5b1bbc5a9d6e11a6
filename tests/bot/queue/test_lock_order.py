"""Row locks are taken in one order everywhere — repository, pull request, its evaluations — with the real
PostgreSQL: a webhook handler cancelling an evaluation and the start claim of that evaluation arriving at the
same moment once deadlocked, and PostgreSQL aborted the handler (the `closed` of GitHub's examples: a delivery
with a failed attempt, tests/bot/test_faults.py waited 60 s for it)."""
from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from bot.db.engine import session_scope
from bot.service import Service
from tests.bot.conftest import wait_until
from tests.bot.queue.test_watchdog import open_pr, quiet_celery  # noqa: F401  (a fixture)

pytestmark = pytest.mark.services


def lock_waiters() -> int:
    with session_scope() as s:
        return s.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                             "AND wait_event_type = 'Lock'"))


def test_a_start_claim_during_a_cancel_waits_for_the_pull_request_without_holding_the_evaluation(
        settings, github, remote, quiet_celery):  # noqa: F811
    service = Service(settings, celery=quiet_celery[0])
    ev = open_pr(service, github, remote)
    claimed: list[str | BaseException] = []

    def claim():
        try:
            with session_scope() as s:
                claimed.append(service.evaluation_started(s, ev.id, "gpu@box", ev.celery_task_id, None))
        except BaseException as exc:  # noqa: BLE001 - reported below
            claimed.append(exc)

    with session_scope() as handler:  # what a `closed` delivery does: the PR's lock, then cancel its evaluations
        pr = service.lock_pull(handler, ev.pull_request_id)
        t = threading.Thread(target=claim)
        t.start()
        wait_until(lambda: lock_waiters() == 1, timeout=10, what="the claim waiting for a lock")
        # With the claim holding the evaluation's lock while it waited for the PR's, this was the deadlock.
        assert service.cancel(handler, pr, by=None) == 1
    t.join(timeout=20)
    assert claimed == [f"evaluation {ev.id} is cancelled: ignored"]
