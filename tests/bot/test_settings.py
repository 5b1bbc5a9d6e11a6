"""Settings: read lazily from the environment, placeholder secrets refused outside development."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.settings import Settings, get_settings, override_settings


def test_no_environment_read_at_import():
    """Importing the service with an environment that would be rejected must not fail: nothing is read yet."""
    env = {**os.environ, "TOKENGATE_ENVIRONMENT": "production", "TOKENGATE_WEBHOOK_SECRET": "changeme"}
    code = ("import bot.web.webhook, bot.queue.tasks, bot.cli, bot.rounds, bot.queue.watchdog, bot.queue.app, worker.queue.app\n"
            "from bot.settings import get_settings\n"
            "try:\n    get_settings()\nexcept Exception as e:\n    print('rejected on use:', type(e).__name__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "rejected on use: ValidationError" in out.stdout


def test_reads_environment_on_first_use(monkeypatch):
    override_settings(None)
    monkeypatch.setenv("TOKENGATE_APPROVAL_LABEL", "ok-to-eval")
    monkeypatch.setenv("TOKENGATE_EVAL__PROFILE", "full")
    try:
        s = get_settings()
        assert (s.approval_label, s.eval.profile) == ("ok-to-eval", "full")
        assert get_settings() is s  # read once
    finally:
        override_settings(None)


@pytest.mark.parametrize("secret", ["", "changeme", "development", "  Secret "])
def test_placeholder_secret_rejected_outside_development(secret):
    with pytest.raises(ValidationError, match="placeholder"):
        Settings(environment="production", webhook_secret=secret)
    Settings(environment="development", webhook_secret=secret)  # fine for local work


def test_placeholder_database_password_rejected_outside_development():
    url = "postgresql+psycopg2://tokengate:changeme@postgres:5432/tokengate"
    with pytest.raises(ValidationError, match="TOKENGATE_DATABASE_URL"):
        Settings(environment="production", webhook_secret="a-real-secret-value", database_url=url)
    Settings(environment="production", webhook_secret="a-real-secret-value",
             database_url=url.replace("changeme", "k7Qv9pL2"))
    Settings(environment="development", database_url=url)


def test_watchdog_grace_must_cover_the_heartbeat():
    with pytest.raises(ValidationError, match="HEARTBEAT_TTL_S"):
        Settings(watchdog_lost_after_s=10, heartbeat_ttl_s=30)


def test_missing_app_credentials_are_named():
    s = Settings(environment="production", webhook_secret="a-real-secret-value")
    with pytest.raises(ValueError, match="TOKENGATE_APP_ID"):
        s.require_github()
    with pytest.raises(ValueError, match="private key"):
        Settings(app_id=1).require_github()


def test_private_key_from_file(tmp_path):
    key = tmp_path / "app.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n...")
    assert Settings(private_key_path=key).private_key_pem().startswith("-----BEGIN")
