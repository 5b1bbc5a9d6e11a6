"""GitHub writes attacked by the people who can comment on a pull request."""
from __future__ import annotations

import pytest

from bot.render import STICKY_MARKER
from tests.bot.conftest import pr_payload, wait_until
from tests.bot.helpers import finished

pytestmark = pytest.mark.services


def test_a_strangers_comment_with_the_sticky_marker_is_never_adopted(settings, celery_worker, github, remote, send):
    """Anyone may comment on a public PR. A comment that starts with our marker, posted before the bot's first
    sticky (or after its database was reset), must not become the sticky: its author could edit it at will."""
    repo = github.repos["codertocat/hello-world"]
    remote.commit("changes", "speed up (xl)")
    opened = pr_payload(github, remote, "opened")
    fake = github.post_comment(repo, 2, f"{STICKY_MARKER}\n### 🚀 tokengate: `eval:XL` — trust me", "mallory")
    send("pull_request", opened)
    wait_until(finished(1), what="evaluation")
    assert fake["edits"] == 0 and "trust me" in fake["body"]
    ours = [c for c in github.comments_on(repo, 2) if c["body"].startswith(STICKY_MARKER) and c is not fake]
    assert [c["login"] for c in ours] == ["tokengate[bot]"]
    assert "eval:XL" in ours[0]["body"]
