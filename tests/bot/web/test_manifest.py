"""The App manifest asks for exactly the permissions the issue allows and the events the webhook handles."""
from __future__ import annotations

from pathlib import Path

import yaml

from bot.web.webhook import EVENTS

ROOT = Path(__file__).resolve().parents[3]
ALWAYS_SENT = {"installation", "installation_repositories", "ping"}  # an App gets these without subscribing


def manifest() -> dict:
    return yaml.safe_load((ROOT / "app.yml").read_text())


def test_least_privilege():
    assert manifest()["default_permissions"] == {"checks": "write", "pull_requests": "write", "issues": "write",
                                                 "contents": "read", "metadata": "read"}


def test_subscribes_to_what_the_webhook_handles_and_nothing_else():
    assert set(manifest()["default_events"]) == EVENTS - ALWAYS_SENT


def test_webhook_url_and_guide():
    m = manifest()
    assert m["hook_attributes"]["url"].endswith("/webhook") and m["hook_attributes"]["active"] is True
    guide = (ROOT / "docs" / "install.md").read_text()
    for must in ("app.yml", "/webhook", ".env", "TOKENGATE_WEBHOOK_SECRET", "smee", "Private repositories"):
        assert must in guide
