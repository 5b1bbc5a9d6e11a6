"""Alembic: an empty PostgreSQL and an empty SQLite database go to head and back to base."""
from __future__ import annotations


import pytest
from sqlalchemy import create_engine, inspect

from bot.db import migrate
from bot.db.models import Base
from tests.bot.conftest import scratch_database

TABLES = {t.name for t in Base.metadata.sorted_tables}


def roundtrip(url: str) -> None:
    migrate.upgrade(url)
    engine = create_engine(url)
    try:
        insp = inspect(engine)
        assert TABLES <= set(insp.get_table_names())
        # The migration matches the models column for column.
        for table in Base.metadata.sorted_tables:
            assert {c["name"] for c in insp.get_columns(table.name)} == set(table.columns.keys()), table.name
        migrate.downgrade(url)
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        migrate.upgrade(url)  # and up again from base
        assert TABLES <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_sqlite_up_and_down(tmp_path):
    roundtrip(f"sqlite:///{tmp_path / 'fresh.sqlite3'}")


@pytest.mark.services
def test_postgresql_up_and_down():
    with scratch_database("migr") as url:
        roundtrip(url)


def test_no_pending_model_changes(tmp_path):
    """Autogenerate against a migrated database finds nothing: models and migrations agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    url = f"sqlite:///{tmp_path / 'cmp.sqlite3'}"
    migrate.upgrade(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []
