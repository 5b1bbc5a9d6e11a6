"""Durable intake of webhook deliveries: a group commit into the outbox (the deliveries table).

Every verified request hands its raw body to one writer thread (per database URL and process). The writer
inserts everything that arrived since its last commit in one transaction and reports each delivery's
outcome only once that transaction is committed: an acknowledged delivery is on disk. Under a burst the
requests share commits (one WAL flush for many deliveries) instead of queueing for a connection each;
alone, a request waits for one insert. Nothing is parsed here: the handle task reads the body.

Outcomes: "queued" (stored now, or stored earlier and not processed yet: GitHub's redelivery of one we
answered 503), "duplicate" (processed or given up on, or the same body under another delivery id: a
replay), "db_unavailable".
"""
from __future__ import annotations

import hashlib
import io
import logging
import queue
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sqlalchemy import or_, select
from sqlalchemy.engine import Connection

from bot.db.engine import engine_for
from bot.db.models import Delivery, utcnow

log = logging.getLogger(__name__)

MAX_BATCH = 256  # deliveries in one transaction
MAX_BATCH_BYTES = 32 * 1024 * 1024  # and bodies (each up to 25 MB) in one statement, roughly


@dataclass
class Pending:
    delivery_id: str
    event: str
    body: bytes
    done: Callable[[str], None]  # called once, from the writer thread, with the outcome
    received_at: datetime = field(default_factory=utcnow)
    digest: str = ""


class OutboxWriter:
    """One thread, one connection at a time, one transaction per batch."""

    def __init__(self, url: str):
        self.url = url
        self._queue: queue.SimpleQueue[Pending] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="outbox-writer", daemon=True).start()

    def submit(self, item: Pending) -> None:
        self._queue.put(item)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            size = len(batch[0].body)
            # Whatever queued up while the last commit was flushing joins this one: no waiting to fill a batch.
            while len(batch) < MAX_BATCH and size < MAX_BATCH_BYTES:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(item)
                size += len(item.body)
            try:
                outcomes = self.write(batch)
            except Exception:  # noqa: BLE001 - the thread must live on; the requests get their 503
                log.exception("outbox: %d deliveries not stored: database unavailable", len(batch))
                outcomes = {id(item): "db_unavailable" for item in batch}
            for item in batch:
                try:
                    item.done(outcomes[id(item)])
                except Exception:  # noqa: BLE001 - a request that went away
                    log.debug("outbox: answer for %s not delivered", item.delivery_id, exc_info=True)

    def write(self, batch: list[Pending]) -> dict[int, str]:
        """Store the batch in one transaction; {id(item): outcome}."""
        for item in batch:
            item.digest = item.digest or hashlib.sha256(item.body).hexdigest()  # releases the GIL on big bodies
        fresh, known, ids, digests = [], [], set(), set()
        for item in batch:  # a second item with a taken id or body is decided against the first, once stored
            (known if item.delivery_id in ids or item.digest in digests else fresh).append(item)
            ids.add(item.delivery_id)
            digests.add(item.digest)
        engine = engine_for(self.url)
        outcomes: dict[int, str] = {}
        try:
            with engine.begin() as conn:
                stored = _copy_new(conn, fresh) if conn.dialect.name == "postgresql" else _insert_new(conn, fresh)
        except engine.dialect.loaded_dbapi.IntegrityError:  # one of them is known: each decided on its own
            with engine.begin() as conn:
                stored = _insert_new(conn, fresh)
        for item in fresh:
            if item.delivery_id in stored:
                outcomes[id(item)] = "queued"
            else:
                known.append(item)
        if known:
            with engine.connect() as conn:
                for item in known:
                    outcomes[id(item)] = _known(conn, item.delivery_id, item.digest)
        return outcomes


COPY = ("COPY deliveries (id, event, body, body_sha256, received_at, attempts) FROM STDIN WITH (FORMAT binary)")
PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def _copy_new(conn: Connection, items: list[Pending]) -> set[str]:
    """PostgreSQL, when none of them is known (nearly always): one binary COPY, the bodies as raw bytes — half
    the server's work of an INSERT, which parses each body back out of a hex literal. Raises IntegrityError
    (the whole COPY undone) when one is known. next_attempt_at NULL: due at once, for the drain the kick asks
    for (bot/queue/kick.py)."""
    if not items:
        return set()
    out = [b"PGCOPY\n\xff\r\n\x00", struct.pack("!ii", 0, 0)]
    for i in items:
        micros = (i.received_at - PG_EPOCH) // timedelta(microseconds=1)
        out.append(struct.pack("!h", 6))
        for value in (i.delivery_id.encode(), i.event.encode(), i.body, i.digest.encode()):
            out += (struct.pack("!i", len(value)), value)
        out.append(struct.pack("!iqii", 8, micros, 4, 0))
    out.append(struct.pack("!h", -1))
    with conn.connection.driver_connection.cursor() as cur:
        cur.copy_expert(COPY, io.BytesIO(b"".join(out)))
    return {i.delivery_id for i in items}


def _insert_new(conn: Connection, items: list[Pending]) -> set[str]:
    """INSERT … ON CONFLICT DO NOTHING (either unique key: id or body hash); the ids stored now."""
    if not items:
        return set()
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    rows = [{"id": i.delivery_id, "event": i.event, "body": i.body, "body_sha256": i.digest,
             "received_at": i.received_at, "attempts": 0, "next_attempt_at": None} for i in items]
    stmt = insert(Delivery).on_conflict_do_nothing().returning(Delivery.id)
    return set(conn.execute(stmt, rows).scalars())


def _known(conn: Connection, delivery_id: str, digest: str) -> str:
    rows = conn.execute(select(Delivery.id, Delivery.body_sha256, Delivery.processed_at, Delivery.failed_at)
                        .where(or_(Delivery.id == delivery_id, Delivery.body_sha256 == digest))).all()
    same = [r for r in rows if r.id == delivery_id]
    if same and same[0].processed_at is None and same[0].failed_at is None and same[0].body_sha256 == digest:
        return "queued"
    return "duplicate"


_writers: dict[str, OutboxWriter] = {}
_lock = threading.Lock()


def writer_for(url: str) -> OutboxWriter:
    with _lock:
        if url not in _writers:
            _writers[url] = OutboxWriter(url)
        return _writers[url]
