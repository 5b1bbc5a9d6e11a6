"""Who may trigger, approvals, commands, supersede, cancel, INFRA handling — through the real queue."""
from __future__ import annotations

import uuid

import pytest
import redis

from bot.enums import EvalState
from bot.render import STICKY_MARKER
from tests.bot.conftest import comment_payload, pr_payload, wait_until
from tests.bot.helpers import evaluations, finished, processed, state_of

pytestmark = pytest.mark.services


def sticky(github) -> list[dict]:
    return [c for c in github.comments.values() if c["body"].startswith(STICKY_MARKER)]


def release(settings, sha: str) -> None:
    redis.Redis.from_url(settings.broker_url).set(f"{settings.redis_key_prefix}tokengate:result:release:{sha}", 1, ex=60)


def running(eval_index: int = 0):
    def check():
        evs = evaluations()
        return len(evs) > eval_index and evs[eval_index].state is EvalState.RUNNING
    return check


def test_untrusted_author_needs_approval_again_after_each_push(settings, celery_worker, github, remote, send):
    repo = github.repos["codertocat/hello-world"]
    remote.commit("contrib", "speed up (xl)")
    d = "d-open"
    send("pull_request", pr_payload(github, remote, "opened", author="outsider", head_ref="contrib"), delivery=d)
    wait_until(lambda: processed(d), what="opened handled")
    assert evaluations() == []
    (note,) = sticky(github)
    assert "add the **`eval-approved`** label" in note["body"]

    # A maintainer approves with the label: evaluation runs.
    repo.pulls[2].labels.append("eval-approved")
    send("pull_request", pr_payload(github, remote, "labeled", author="outsider", head_ref="contrib",
                                    sender="maintainer", label="eval-approved"))
    wait_until(finished(1), what="approved evaluation")
    assert evaluations()[0].verdict == "XL"

    # New push by the contributor: approval removed, nothing queued, the same comment asks again.
    remote.commit("contrib", "more (slow)")
    d = "d-push"
    send("pull_request", pr_payload(github, remote, "synchronize", author="outsider", head_ref="contrib"),
         delivery=d)
    wait_until(lambda: processed(d), what="push handled")
    assert len(evaluations()) == 1
    assert "eval-approved" not in repo.pulls[2].labels
    assert [r.path.rsplit("/", 1)[-1] for r in github.requests_for("issues/remove-label")] == ["eval-approved"]
    (note,) = sticky(github)
    assert note["id"] == sticky(github)[0]["id"] and "waiting for a maintainer" in note["body"]


def test_approval_label_from_someone_without_write_access_is_ignored(settings, celery_worker, github, remote,
                                                                    send):
    remote.commit("contrib", "speed up (xl)")
    github.repos["codertocat/hello-world"].pulls.clear()
    d = "d-label"
    payload = pr_payload(github, remote, "labeled", author="outsider", head_ref="contrib", sender="outsider",
                         labels=["eval-approved"], label="eval-approved")
    send("pull_request", payload, delivery=d)
    wait_until(lambda: processed(d), what="label handled")
    assert evaluations() == []
    assert "eval-approved" not in github.repos["codertocat/hello-world"].pulls[2].labels


def test_command_from_user_without_permission_is_refused(settings, celery_worker, github, remote, send):
    remote.commit("contrib", "speed up (xl)")
    d0 = "d-open"
    send("pull_request", pr_payload(github, remote, "opened", author="outsider", head_ref="contrib"), delivery=d0)
    wait_until(lambda: processed(d0), what="opened")
    d = "d-cmd"
    send("issue_comment", comment_payload(github, 2, "/eval", "outsider"), delivery=d)
    wait_until(lambda: processed(d), what="command handled")
    assert evaluations() == []
    replies = [c for c in github.comments.values() if not c["body"].startswith(STICKY_MARKER)]
    assert len(replies) == 1 and "needs write access" in replies[0]["body"]
    # The permission was asked of GitHub (and cached: the second look-up is not repeated).
    perms = [r.path for r in github.requests_for("repos/get-collaborator-permission-level")]
    assert perms.count("/repos/Codertocat/Hello-World/collaborators/outsider/permission") == 1

    # The same command from a maintainer runs it (and counts as approval of this head).
    send("issue_comment", comment_payload(github, 2, "Looks good.\n/eval rerun", "maintainer"))
    wait_until(finished(1), what="maintainer's evaluation")
    assert evaluations()[0].requested_by == "maintainer"


def test_push_mid_evaluation_supersedes_and_late_result_is_ignored(settings, celery_worker, github, remote, send):
    repo = github.repos["codertocat/hello-world"]
    sha1 = remote.commit("changes", "experiment (block)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(running(0), what="first evaluation running")
    sha2 = remote.commit("changes", "better (xl)")
    send("pull_request", pr_payload(github, remote, "synchronize"))
    wait_until(lambda: len(evaluations()) == 2 and evaluations()[0].state is EvalState.SUPERSEDED,
               what="supersede")
    first = evaluations()[0]
    assert github.check_runs[first.check_run_id]["conclusion"] == "cancelled"
    release(settings, sha1)  # the old evaluation finishes after all: its result must not be published
    wait_until(lambda: evaluations()[1].state is EvalState.DONE, what="second evaluation")
    wait_until(lambda: any(r.operation == "checks/update" for r in github.requests) and
               _result_seen(first.id), timeout=10, what="late result processed")
    assert state_of(first.id) is EvalState.SUPERSEDED
    assert evaluations()[0].result is None
    assert repo.pulls[2].labels == ["eval:XL", "eval-qwen35-tiny:XL"]
    (note,) = sticky(github)
    assert note["body"].index(sha2[:7]) < note["body"].index("Earlier runs")
    assert [e.head_sha for e in evaluations()] == [sha1, sha2]


def _result_seen(eval_id: int) -> bool:
    """The publish task for the superseded evaluation has run (its task result is stored)."""
    from bot.queue.app import celery_app
    ev = next(e for e in evaluations() if e.id == eval_id)
    res = celery_app().AsyncResult(ev.celery_task_id)
    return res.ready()


def test_eval_cancel(settings, celery_worker, github, remote, send):
    sha = remote.commit("changes", "experiment (block)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(running(0), what="evaluation running")
    d = "d-cancel"
    send("issue_comment", comment_payload(github, 2, "/eval cancel", "maintainer"), delivery=d)
    wait_until(lambda: processed(d), what="cancel handled")
    (ev,) = evaluations()
    assert ev.state is EvalState.CANCELLED and ev.requested_by == "maintainer"
    assert github.check_runs[ev.check_run_id]["conclusion"] == "cancelled"
    release(settings, sha)
    wait_until(lambda: _result_seen(ev.id), what="late result")
    assert state_of(ev.id) is EvalState.CANCELLED
    assert "Cancelled by @maintainer" in sticky(github)[0]["body"]
    assert github.repos["codertocat/hello-world"].pulls[2].labels == []


def test_infra_is_action_required_retried_and_never_reject(settings, celery_worker, github, remote, send):
    repo = github.repos["codertocat/hello-world"]
    remote.commit("changes", "kernel tweak (infra)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="evaluation gives up")
    (ev,) = evaluations()
    assert (ev.state, ev.verdict, ev.attempt) == (EvalState.INFRA, "INFRA", 2)  # retries=1 → 2 attempts
    runs = [github.check_runs[r.response["id"]] for r in github.requests_for("checks/create")]
    assert len(runs) == 2
    assert [r["conclusion"] for r in runs] == ["action_required", "action_required"]
    assert runs[-1]["actions"][0]["identifier"] == "rerun"
    assert repo.pulls[2].labels == ["eval:INFRA"]
    body = sticky(github)[0]["body"]
    assert "not a verdict on your PR" in body and "foreign_gpu_process" in body
    assert "Gave up after 2 attempts" in body and "REJECT" not in body

    # "Re-run" on the check run queues it again.
    import json
    from tests.bot.conftest import load_payload
    payload = load_payload("check_run.rerequested")
    payload["check_run"]["id"] = ev.check_run_id
    payload["repository"] = github._urls(github._repo_json(repo))
    payload["installation"] = {"id": 1}
    remote.git("log", "-1")  # unchanged head
    # An outsider's Re-run is refused (the sender's permission is checked), a maintainer's queues it.
    payload["sender"] = github._user("outsider")
    outsider = str(uuid.uuid4())
    send("check_run", json.loads(json.dumps(payload)), delivery=outsider)
    wait_until(lambda: processed(outsider), what="outsider's re-run handled")
    assert "without write access: refused" in processed(outsider).outcome
    assert len(evaluations()) == 1
    payload["sender"] = github._user("maintainer")
    send("check_run", json.loads(json.dumps(payload)))
    wait_until(lambda: len(evaluations()) == 2, what="re-run queued")
    wait_until(finished(2), what="re-run finished")


def test_infra_retry_then_success_and_crash_is_infra(settings, celery_worker, github, remote, send):
    repo = github.repos["codertocat/hello-world"]
    remote.commit("changes", "kernel tweak (flaky)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="flaky evaluation")
    (ev,) = evaluations()
    assert (ev.state, ev.verdict, ev.attempt) == (EvalState.DONE, "XL", 2)
    assert repo.pulls[2].labels == ["eval:XL", "eval-qwen35-tiny:XL"]

    remote.commit("changes", "oops (crash)")
    send("pull_request", pr_payload(github, remote, "synchronize"))
    wait_until(finished(2), what="crashing evaluation")
    ev = evaluations()[1]
    assert (ev.state, ev.infra_kind) == (EvalState.INFRA, "internal_error")
    assert "illegal memory access" in ev.infra_detail
    assert repo.pulls[2].labels == ["eval:INFRA"]


def test_a_closed_pull_request_is_never_evaluated_again(settings, celery_worker, github, remote, send):
    """`/eval rerun`, the check's Re-run or the approval label on a closed (or merged) PR would spend a GPU on
    something that can no longer merge, and relabel it."""
    import json
    from tests.bot.conftest import load_payload
    repo = github.repos["codertocat/hello-world"]
    remote.commit("changes", "speed up (xl)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="evaluation")
    (ev,) = evaluations()
    repo.pulls[2].state = "closed"
    d = send("pull_request", pr_payload(github, remote, "closed")).json()["delivery"]
    wait_until(lambda: processed(d), what="closed handled")
    requests = len(github.requests)

    command = send("issue_comment", comment_payload(github, 2, "/eval rerun", "maintainer")).json()["delivery"]
    rerun = load_payload("check_run.rerequested")
    rerun.update(repository=github._urls(github._repo_json(repo)), installation={"id": 1},
                 sender=github._user("maintainer"))
    rerun["check_run"]["id"] = ev.check_run_id
    button = send("check_run", json.loads(json.dumps(rerun))).json()["delivery"]
    label = send("pull_request", pr_payload(github, remote, "labeled", sender="maintainer",
                                            label="eval-approved")).json()["delivery"]
    for delivery in (command, button, label):
        wait_until(lambda: processed(delivery), what="handled")
        assert "closed" in processed(delivery).outcome, processed(delivery).outcome
    assert len(evaluations()) == 1
    writes = [r.operation for r in github.requests[requests:] if r.method != "GET"]
    assert writes == ["issues/create-comment"]  # the command's author is told why nothing ran
    assert "closed" in list(github.comments_on(repo, 2))[-1]["body"]


def test_a_command_shown_in_code_is_not_a_command():
    """A maintainer explaining the commands in a code block (fenced or indented) runs none of them."""
    from bot.enums import Command
    from bot.handlers import parse_command
    assert parse_command("To re-run it, comment:\n```\n/eval rerun\n```") is None
    assert parse_command("~~~~text\n/eval cancel\n~~~~\nthanks") is None
    assert parse_command("```\nunclosed, to the end\n/eval") is None
    assert parse_command("Like this:\n\n    /eval cancel\n") is None
    assert parse_command("Like this:\n\n\t/eval cancel\n") is None
    assert parse_command("> /eval\nnot yet") is None
    assert parse_command("```\nlog\n```\n/eval") is Command.EVAL  # after the block it is one
    assert parse_command("   /eval status") is Command.STATUS


def test_an_edited_comment_or_a_bots_comment_runs_no_command(settings, celery_worker, github, remote, send):
    """A harmless comment edited into `/eval` (GitHub's `edited`) is not a command, even by a maintainer (an
    edit is not dated like a new comment, so its head approval could not be placed); nor is a bot's `/eval`,
    even one with write access."""
    repo = github.repos["codertocat/hello-world"]
    repo.permissions["ci-bot[bot]"] = "write"
    remote.commit("contrib", "speed up (xl)")
    opened = send("pull_request", pr_payload(github, remote, "opened", author="outsider", head_ref="contrib"))
    wait_until(lambda: processed(opened.json()["delivery"]), what="opened")
    edited = comment_payload(github, 2, "/eval", "maintainer")
    edited["action"] = "edited"
    edited["changes"] = {"body": {"from": "Nice work."}}
    by_bot = comment_payload(github, 2, "/eval", "ci-bot[bot]")
    by_bot["comment"]["user"]["type"] = "Bot"
    for payload, outcome in ((edited, "ignored issue_comment.edited"), (by_bot, "comment by a bot")):
        d = send("issue_comment", payload).json()["delivery"]
        wait_until(lambda: processed(d), what="comment handled")
        assert processed(d).outcome == outcome
    assert evaluations() == []


def test_a_retargeted_pull_request_is_evaluated_against_its_new_base(settings, celery_worker, github, remote, send):
    """Changing a PR's base sends `pull_request.edited` with `changes.base`: its verdict against the old base
    says nothing about merging into the new one, so it is measured again there. A title edit queues nothing."""
    repo = github.repos["codertocat/hello-world"]
    remote.commit("changes", "speed up (xl)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="evaluation against main")

    title = pr_payload(github, remote, "opened")
    title.update(action="edited", changes={"title": {"from": "PR 2 (old title)"}})
    d = send("pull_request", title).json()["delivery"]
    wait_until(lambda: processed(d), what="title edit handled")
    assert "nothing queued" in processed(d).outcome and len(evaluations()) == 1

    remote.commit("release", "release branch")  # a base of its own (a retarget to the same commit measures nothing new)
    old_base = evaluations()[0].base_sha
    repo.pulls[2].base_ref = "release"
    retarget = pr_payload(github, remote, "opened")
    retarget.update(action="edited", changes={"base": {"ref": {"from": "main"}, "sha": {"from": old_base}}})
    assert retarget["pull_request"]["base"]["ref"] == "release"
    d = send("pull_request", retarget).json()["delivery"]
    wait_until(lambda: processed(d), what="retarget handled")
    wait_until(finished(2), what="evaluation against release")
    first, second = evaluations()
    assert (first.base_ref, second.base_ref) == ("main", "release")
    assert second.base_sha == retarget["pull_request"]["base"]["sha"] and second.head_sha == first.head_sha
