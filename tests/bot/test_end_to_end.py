"""Signed webhook → Redis → real Celery worker running the (fake) evaluation → sticky comment, check run, labels."""
from __future__ import annotations

import pytest

from bot.enums import EvalState
from bot.render import STICKY_MARKER
from tests.bot.conftest import pr_payload, wait_until
from tests.bot.helpers import evaluations, finished

pytestmark = pytest.mark.services


def bot_comments(github):
    return [c for c in github.comments.values() if c["body"].startswith(STICKY_MARKER)]


def test_two_runs_edit_one_comment_and_replace_labels(settings, celery_worker, github, remote, send):
    repo = github.repos["codertocat/hello-world"]
    sha1 = remote.commit("changes", "speed up decode (xl)")
    r = send("pull_request", pr_payload(github, remote, "opened"))
    assert r.status_code == 202

    wait_until(finished(1), what="first evaluation")
    (ev1,) = evaluations()
    assert (ev1.state, ev1.verdict, ev1.head_sha) == (EvalState.DONE, "XL", sha1)
    assert repo.pulls[2].labels == ["eval:XL", "eval-qwen35-tiny:XL"]
    run1 = github.check_runs[ev1.check_run_id]
    assert (run1["status"], run1["conclusion"]) == ("completed", "success")
    # in_progress may be skipped: the fake finishes before its "started" message is handled by another thread.
    statuses = [h.get("status") for h in run1["history"]]
    assert statuses[0] == "queued" and statuses[-1] == "completed", statuses
    (comment,) = bot_comments(github)
    assert "`eval:XL`" in comment["body"] and "+45.2%" in comment["body"]

    # A second push that makes things slower: same comment edited, labels replaced, older run collapsed.
    repo.pulls[2].labels.append("area:kernels")  # someone else's label survives
    sha2 = remote.commit("changes", "refactor (slow)")
    send("pull_request", pr_payload(github, remote, "synchronize"))
    wait_until(finished(2), what="second evaluation")
    ev2 = evaluations()[1]
    assert (ev2.state, ev2.verdict, ev2.head_sha) == (EvalState.DONE, "REJECT", sha2)
    (comment2,) = bot_comments(github)
    assert comment2["id"] == comment["id"] and comment2["edits"] >= 1
    body = comment2["body"]
    assert body.index("`eval:REJECT`") < body.index("<details><summary>Earlier runs (1)")
    assert body.index("<details>") < body.index(sha1[:7] + "` — `eval:XL`")
    assert sorted(repo.pulls[2].labels) == sorted(["area:kernels", "eval:REJECT", "eval-qwen35-tiny:REJECT",
                                                   "regression-qwen35-tiny-decode@4096"])
    run2 = github.check_runs[ev2.check_run_id]
    assert (run2["head_sha"], run2["conclusion"]) == (sha2, "failure")
    assert "decode@4096" in run2["output"]["summary"]
