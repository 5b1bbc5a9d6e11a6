"""The webhook's durable intake (bot/queue/intake.py) against the real PostgreSQL: one group commit for many
deliveries, every answer only after its commit, the raw body stored unparsed and read by the handle task."""
from __future__ import annotations

import json
import threading
import uuid

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import select

from bot.db.engine import engine_for, session_scope
from bot.db.models import Delivery
from bot.queue import intake
from tests.bot.conftest import PAYLOADS, signed_headers, wait_until
from tests.bot.helpers import processed

pytestmark = pytest.mark.services


def body_for(n: int) -> bytes:
    return json.dumps({"zen": f"delivery {n}", "hook_id": n}).encode()


def collect(items: list[tuple[str, bytes]], url: str) -> dict[str, str]:
    """Hand every (delivery id, body) to a fresh writer at once; {delivery id: outcome} once all answered."""
    writer = intake.OutboxWriter(url)
    outcomes: dict[str, str] = {}
    all_done = threading.Event()

    def done_for(delivery_id):
        def done(outcome):
            committed = stored(delivery_id)  # the answer comes after the commit, never before
            outcomes[delivery_id] = outcome if committed or outcome != "queued" else "answered before its commit"
            if len(outcomes) == len(items):
                all_done.set()
        return done

    for delivery_id, body in items:
        writer.submit(intake.Pending(delivery_id, "ping", body, done_for(delivery_id)))
    assert all_done.wait(30), outcomes
    return outcomes


def stored(delivery_id: str) -> bool:
    with engine_for(url_of()).connect() as conn:  # another connection: sees committed rows only
        return conn.execute(select(Delivery.id).where(Delivery.id == delivery_id)).first() is not None


def url_of() -> str:
    from bot.settings import get_settings
    return get_settings().database_url


def test_many_deliveries_share_commits_and_each_is_answered_after_its_own(settings):
    commits = []
    engine = engine_for(settings.database_url)
    listener = lambda conn: commits.append(1)  # noqa: E731
    sa_event.listen(engine, "commit", listener)
    try:
        items = [(str(uuid.uuid4()), body_for(n)) for n in range(60)]
        outcomes = collect(items, settings.database_url)
    finally:
        sa_event.remove(engine, "commit", listener)
    assert set(outcomes.values()) == {"queued"}, outcomes
    assert len(commits) < len(items)  # grouped: far fewer transactions than deliveries
    with session_scope() as s:
        rows = {d.id: d for d in s.scalars(select(Delivery))}
    assert set(rows) == {i for i, _ in items}
    first = rows[items[0][0]]
    assert first.body == items[0][1] and first.payload is None and first.action is None  # raw, unparsed
    assert first.next_attempt_at is None and first.processed_at is None  # due for the drain at once


def test_a_batch_with_known_deliveries_still_stores_the_others(settings):
    """A redelivery or a replay in a batch fails the fast COPY; each delivery is then decided on its own."""
    known_id, replayed = str(uuid.uuid4()), body_for(1000)
    assert collect([(known_id, replayed)], settings.database_url) == {known_id: "queued"}
    fresh = [(str(uuid.uuid4()), body_for(n)) for n in range(5)]
    again = str(uuid.uuid4())
    outcomes = collect([*fresh, (known_id, replayed), (again, replayed)], settings.database_url)
    assert {outcomes[i] for i, _ in fresh} == {"queued"}
    assert outcomes[known_id] == "queued"  # stored, not processed yet: GitHub's redelivery is queued again
    assert outcomes[again] == "duplicate"  # the same signed body under a new id: a replay
    with session_scope() as s:
        assert s.get(Delivery, again) is None
        s.get(Delivery, known_id).processed_at = s.get(Delivery, known_id).received_at
    assert collect([(known_id, replayed)], settings.database_url) == {known_id: "duplicate"}


def test_the_same_delivery_twice_in_one_batch_is_stored_once(settings):
    d = str(uuid.uuid4())
    outcomes = []
    writer_items = [(d, body_for(7)), (d, body_for(7))]
    writer = intake.OutboxWriter(settings.database_url)
    both = threading.Event()
    for delivery_id, body in writer_items:
        writer.submit(intake.Pending(delivery_id, "ping", body,
                                     lambda o: (outcomes.append(o), len(outcomes) == 2 and both.set())))
    assert both.wait(30)
    assert outcomes == ["queued", "queued"]
    with session_scope() as s:
        assert len(list(s.scalars(select(Delivery).where(Delivery.id == d)))) == 1


def test_database_down_answers_every_request_of_the_batch_unavailable(settings):
    outcomes = collect([(str(uuid.uuid4()), body_for(n)) for n in range(3)],
                       "postgresql+psycopg2://postgres@127.0.0.1:1/nowhere")
    assert set(outcomes.values()) == {"db_unavailable"}


def test_a_signed_body_that_is_not_json_is_stored_and_given_up_on_in_the_handler(settings, celery_worker, client):
    body = b'{"zen": not json'
    d = str(uuid.uuid4())
    r = client.post("/webhook", content=body, headers=signed_headers(body, "ping", d))
    assert (r.status_code, r.json()["status"]) == (202, "queued")

    def given_up():
        with session_scope() as s:
            row = s.get(Delivery, d)
            return row if row is not None and row.failed_at is not None else None
    row = wait_until(given_up, what="bad body given up on")
    assert "not JSON" in row.outcome and row.attempts == 0  # no retries: it will never parse


def test_the_handler_reads_the_raw_body_and_records_the_action(settings, celery_worker, client):
    payload = json.loads((PAYLOADS / "ping.json").read_text())
    payload["zen"] = "nul \u0000 inside"
    payload["action"] = "pinged"
    body = json.dumps(payload).encode()
    d = str(uuid.uuid4())
    assert client.post("/webhook", content=body, headers=signed_headers(body, "ping", d)).status_code == 202
    row = wait_until(lambda: processed(d), what="ping handled")
    assert row.action == "pinged" and row.body == body
