"""`tokengate` dispatcher: service subcommands work, evaluation subcommands are delegated lazily."""
from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect

from bot import cli
from bot.settings import Settings, override_settings


def test_db_upgrade_and_downgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    assert cli.main(["db", "upgrade", "--url", url]) == 0
    engine = create_engine(url)
    assert "evaluations" in inspect(engine).get_table_names()
    assert cli.main(["db", "downgrade", "--url", url]) == 0
    assert "evaluations" not in inspect(engine).get_table_names()
    engine.dispose()


def test_round_close_unknown_repository(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    cli.main(["db", "upgrade", "--url", url])
    override_settings(Settings(database_url=url))
    try:
        assert cli.main(["round", "close", "nobody/nothing", "--dry-run"]) == 2
    finally:
        override_settings(None)
    assert "unknown repository" in capsys.readouterr().out


def test_worker_rejects_unknown_queue():
    with pytest.raises(SystemExit, match="unknown queue"):
        cli.main(["worker", "--queues", "cpu"])


def test_evaluation_subcommands_are_delegated(monkeypatch):
    import sys
    import types
    fake = types.ModuleType("worker.cli")
    fake.eval_main = lambda argv: 7 if argv == ["--head", "abc"] else 1
    monkeypatch.setitem(sys.modules, "worker.cli", fake)
    assert cli.main(["eval", "--head", "abc"]) == 7


def test_subcommand_required(capsys):
    with pytest.raises(SystemExit):
        cli.main([])
