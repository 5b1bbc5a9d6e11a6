"""Engine and session factory for the configured database (created on first use)."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker


@functools.lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    kwargs = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"check_same_thread": False, "timeout": 30}}
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):
        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # FKs off by default in SQLite; WAL lets web + workers share it
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.close()
    return engine


def get_engine() -> Engine:
    from bot.settings import get_settings
    return engine_for(get_settings().database_url)


@functools.lru_cache(maxsize=8)
def _factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(engine_for(url), expire_on_commit=False)


@contextlib.contextmanager
def session_scope() -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    from bot.settings import get_settings
    session = _factory(get_settings().database_url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
