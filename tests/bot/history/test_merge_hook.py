"""The hook: a `pull_request.closed` webhook with merged=true measures the merge commit of main on the gpu
queue (once, however often GitHub redelivers), and its points become main's history."""
from __future__ import annotations

import pytest

from bot.db.engine import session_scope
from bot.db.models import Delivery, MainMeasurement
from tests.bot.conftest import pr_payload, wait_until

pytestmark = pytest.mark.services


def test_merged_pr_measures_main_once(settings, celery_worker, github, remote, send, monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path / "cache"))
    remote.commit("changes", "speed up decode (xl)")
    state = github.repos["codertocat/hello-world"]
    payload = pr_payload(github, remote, "opened")
    remote.git("merge", "-q", "--squash", "changes")
    remote.git("commit", "-q", "-m", "speed up decode (xl) (#2)")
    merge_sha, parent = remote.git("rev-parse", "HEAD"), remote.git("rev-parse", "HEAD^")
    pr = state.pulls[2]
    pr.state, pr.merged, pr.merge_commit_sha = "closed", True, merge_sha
    closed = pr_payload(github, remote, "closed")
    assert closed["pull_request"]["merged"] is True
    # A redelivery (new delivery id, same body) must not measure twice: the intake answers it as a
    # replay (200) or, where it is queued, the hook's own duplicate guard skips it.
    codes = [send("pull_request", closed).status_code for _ in range(2)]
    assert codes[0] == 202 and codes[1] in (200, 202), codes

    def handled():
        with session_scope() as session:
            return session.query(Delivery).filter(Delivery.processed_at.is_not(None)).count() == codes.count(202)
    wait_until(handled, timeout=30, what="both deliveries")

    def measured():
        with session_scope() as session:
            rows = session.query(MainMeasurement).all()
            return rows and all(m.state == "done" for m in rows) and [
                (m.kind, m.sha, m.base_sha, m.pull_request.number, sorted(p.gate for p in m.points)) for m in rows]
    rows = wait_until(measured, timeout=30, what="the main measurement")
    assert rows == [("merge", merge_sha, parent, 2, ["decode@4096", "decode@512", "prefill@512"])]
    assert payload  # the PR was known to GitHub before it closed
