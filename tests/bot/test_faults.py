"""Issue 15's rules, each attacked with the real PostgreSQL, Redis, test GitHub server and git remote:
heads only move forward, durable-before-acknowledged deliveries, GitHub outages and connection resets,
replays, approvals tied to a SHA, forged broker messages, hostile payloads, readiness and metrics."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.db.engine import session_scope
from bot.db.models import Delivery, PullRequest
from bot.enums import EvalState
from bot.queue import outbox
from bot.render import STICKY_MARKER
from tests.bot.conftest import (PAYLOADS, comment_payload, pr_payload, signed_headers, wait_until)
from tests.bot.helpers import evaluations, processed, stored_not_handled, two_measured_prs_and_a_due_round

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def stored_pull() -> PullRequest:
    with session_scope() as s:
        return s.scalar(select(PullRequest))


def delivery(delivery_id: str) -> Delivery | None:
    with session_scope() as s:
        return s.get(Delivery, delivery_id)


def stickies(github) -> list[dict]:
    with github.lock:
        return [c for c in github.comments.values() if c["body"].startswith(STICKY_MARKER)]


def drain_until(predicate, settings, timeout: float = 30.0, what: str = "outbox drained"):
    """What the publish worker's beat does every outbox_interval_s, done here in a loop."""
    def step():
        with session_scope() as s:
            outbox.drain(s, settings)
        return predicate()
    return wait_until(step, timeout=timeout, interval=0.3, what=what)


# ---- 1. heads only move forward ---------------------------------------------------------------------

def test_an_older_payload_never_moves_the_head_back(settings, celery_worker, github, remote, send):
    sha1 = remote.commit("changes", "first (xl)")
    opened = pr_payload(github, remote, "opened")  # head sha1, GitHub's updated_at of the example
    sha2 = remote.commit("changes", "second (xl)")
    push = pr_payload(github, remote, "synchronize")
    assert (opened["pull_request"]["head"]["sha"], push["pull_request"]["head"]["sha"]) == (sha1, sha2)
    later = send("pull_request", push).json()["delivery"]
    wait_until(lambda: processed(later), what="synchronize handled")
    # The opened event arrives (or is retried) after its synchronize: same updated_at → commit ancestry.
    late = send("pull_request", opened).json()["delivery"]
    wait_until(lambda: processed(late), what="late opened handled")
    assert "older than the stored" in processed(late).outcome
    assert stored_pull().head_sha == sha2
    # A payload whose updated_at is older is old, whatever its commit (a diverged force-push included).
    stale = json.loads(json.dumps(opened))
    stale["pull_request"]["head"]["sha"] = remote.commit("other", "unrelated (slow)")
    stale["pull_request"]["updated_at"] = "2001-01-01T00:00:00Z"
    stale["action"] = "synchronize"
    old = send("pull_request", stale).json()["delivery"]
    wait_until(lambda: processed(old), what="stale synchronize handled")
    assert stored_pull().head_sha == sha2
    wait_until(lambda: all(not e.state.active for e in evaluations()), what="evaluations done")
    assert [(e.head_sha, e.state) for e in evaluations()] == [(sha2, EvalState.DONE)]
    # A genuinely new head (newer updated_at) supersedes.
    sha3 = remote.commit("changes", "third (xl)")
    newer = pr_payload(github, remote, "synchronize")
    newer["pull_request"]["updated_at"] = iso(datetime.now(timezone.utc))
    d3 = send("pull_request", newer).json()["delivery"]
    wait_until(lambda: processed(d3), what="new head handled")
    assert stored_pull().head_sha == sha3


# ---- 2. durable before acknowledged ---------------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: connections are refused


RECEIVE = """
import json, sys, time
from fastapi.testclient import TestClient
from bot.web.webhook import create_app
body, headers = sys.stdin.buffer.read(), json.loads(sys.argv[1])
with TestClient(create_app()) as c:
    t = time.perf_counter()
    r = c.post("/webhook", content=body, headers=headers)
    took = time.perf_counter() - t
    ready = c.get("/readyz")
print(json.dumps({"status": r.status_code, "took": took, "body": r.json(), "ready": ready.status_code,
                  "ready_body": ready.json()}))
"""


def post_in_subprocess(settings, payload: dict, event: str, delivery: str, **env_over) -> dict:
    """POST through a web app in another process, with its own (possibly broken) database/broker URL."""
    body = json.dumps(payload).encode()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENGATE_ENVIRONMENT": "test",
           "TOKENGATE_WEBHOOK_SECRET": settings.webhook_secret, "TOKENGATE_DATABASE_URL": settings.database_url,
           "TOKENGATE_BROKER_URL": settings.broker_url, "TOKENGATE_REDIS_KEY_PREFIX": settings.redis_key_prefix,
           **env_over}
    out = subprocess.run([sys.executable, "-c", RECEIVE, json.dumps(signed_headers(body, event, delivery))],
                         input=body, capture_output=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def test_broker_down_is_503_within_a_second_and_the_stored_delivery_still_arrives(settings, celery_worker, github,
                                                                                  remote, client):
    remote.commit("changes", "speed up (xl)")
    payload = pr_payload(github, remote, "opened")
    d = str(uuid.uuid4())
    got = post_in_subprocess(settings, payload, "pull_request", d,
                             TOKENGATE_BROKER_URL=f"redis://127.0.0.1:{_closed_port()}/0")
    assert got["status"] == 503 and got["took"] < 1.5, got
    assert got["ready"] == 503 and "broker" in got["ready_body"], got
    row = delivery(d)
    assert row is not None and row.processed_at is None  # durable, though GitHub was told to redeliver
    # GitHub's redelivery (same id, same body) now that the broker is back: queued, handled once.
    body = json.dumps(payload).encode()
    r = client.post("/webhook", content=body, headers=signed_headers(body, "pull_request", d))
    assert (r.status_code, r.json()["status"]) == (202, "queued")
    wait_until(lambda: processed(d), what="redelivered delivery handled")
    again = client.post("/webhook", content=body, headers=signed_headers(body, "pull_request", d))
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="evaluation")
    assert len(evaluations()) == 1 and len(stickies(github)) == 1


def test_a_stored_delivery_whose_message_was_lost_is_sent_again_by_the_outbox(settings, celery_worker, github,
                                                                             remote, send, monkeypatch):
    """The broker lost the message (restart without persistence): the beat's drain sends it again."""
    remote.commit("changes", "speed up (xl)")
    d = stored_not_handled(send, monkeypatch, "pull_request", pr_payload(github, remote, "opened"))
    time.sleep(1.0)
    assert not processed(d)
    with session_scope() as s:  # the handle task a drain sent, then lost in a broker restart
        s.get(Delivery, d).next_attempt_at = datetime.now(timezone.utc) + timedelta(seconds=30)
    settings.outbox_redrive_after_s = 0.1
    time.sleep(0.5)
    assert not processed(d)
    with session_scope() as s:  # redrive time reached
        s.get(Delivery, d).next_attempt_at = datetime.now(timezone.utc) - timedelta(seconds=1)
    drain_until(lambda: processed(d), settings, what="lost delivery re-sent and handled")
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="evaluation")
    assert len(evaluations()) == 1


def test_a_handler_that_died_after_its_dispatch_committed_is_handled_again_once_its_claim_lapses(
        settings, celery_worker, github, remote, send, monkeypatch):
    """The dispatch's commit stores the handler's claim with the evaluation; the process then dies. Marking the
    delivery processed at the claim would lose the rest of its handling for good; a claim that never lapsed
    would hold it for good. While the claim holds, no other handle task or drain takes it; once it lapses the
    outbox hands it out again, and handling it twice evaluates the head once."""
    from bot import handlers
    from bot.queue.tasks import _handle
    remote.commit("changes", "speed up (xl)")
    d = stored_not_handled(send, monkeypatch, "pull_request", pr_payload(github, remote, "opened"))
    real = handlers.Handlers.pull_request

    def dies_after_dispatching(self, session, payload):
        real(self, session, payload)
        raise KeyboardInterrupt("the worker process is killed here")  # not an Exception: no _failed runs
    with monkeypatch.context() as dying:
        dying.setattr(handlers.Handlers, "pull_request", dies_after_dispatching)
        with pytest.raises(KeyboardInterrupt):
            _handle(d)
    assert len(evaluations()) == 1 and not processed(d)
    assert "being handled by another task" in _handle(d)
    with session_scope() as s:
        assert d not in outbox.drain(s, settings)  # claimed: not due
        s.get(Delivery, d).next_attempt_at = datetime.now(timezone.utc) - timedelta(seconds=1)  # lease lapsed
    drain_until(lambda: processed(d), settings, what="the dead handler's delivery handled again")
    wait_until(lambda: not evaluations()[0].state.active, what="evaluation")
    assert len(evaluations()) == 1


def test_a_live_handler_slower_than_its_lease_keeps_its_claim(settings, celery_worker, github, remote, send,
                                                               monkeypatch):
    """A handler still running after `handler_lease_s` (GitHub answering slowly, retried) is alive: its claim is
    renewed while it runs. Lapsed, the outbox handed the delivery to a second handler, which ran beside the first."""
    import threading

    from bot import handlers
    from bot.queue.tasks import _handle
    remote.commit("changes", "speed up (xl)")
    d = stored_not_handled(send, monkeypatch, "pull_request", pr_payload(github, remote, "opened"))
    monkeypatch.setattr(settings, "handler_lease_s", 0.9)
    real, seen = handlers.Handlers.pull_request, {}

    def slow(self, session, payload):
        out = real(self, session, payload)  # its dispatch commits the claim with the evaluation
        if seen:
            return out  # the second handler, when the claim lapsed
        seen["first"] = True
        time.sleep(2.0)  # past the lease: GitHub slow
        with session_scope() as s:
            seen["drained"] = d in outbox.drain(s, settings)
        other = threading.Thread(target=lambda: seen.update(second=_handle(d)), daemon=True)
        other.start()
        other.join(20)
        return out
    monkeypatch.setattr(handlers.Handlers, "pull_request", slow)
    _handle(d)
    assert "being handled by another task" in seen["second"] and not seen["drained"], seen
    assert processed(d) and len(evaluations()) == 1


def test_database_down_is_503(settings, github, remote):
    remote.commit("changes", "x")
    got = post_in_subprocess(settings, pr_payload(github, remote, "opened"), "pull_request", str(uuid.uuid4()),
                             TOKENGATE_DATABASE_URL=f"postgresql+psycopg2://postgres@127.0.0.1:{_closed_port()}/x")
    assert got["status"] == 503 and "database" in got["body"]["error"], got
    assert got["ready"] == 503 and "database" in got["ready_body"], got


def at_the_commit_after_a_check_run(monkeypatch, fault) -> list[int]:
    """The first commit after a check run is created (in that thread) is `fault(session, commit)` instead.
    Returns the check runs created before such a commit."""
    import threading

    from sqlalchemy.orm import Session

    from bot.github import publish
    real_create, real_commit = publish.create_check, Session.commit
    pending: dict[int, int] = {}  # thread → the check run it created, not yet committed
    orphans: list[int] = []

    def create_check(*args, **kwargs):
        run_id = real_create(*args, **kwargs)
        if not orphans:
            pending[threading.get_ident()] = run_id
        return run_id

    def commit(session):
        run_id = pending.pop(threading.get_ident(), None)
        if run_id is None:
            return real_commit(session)
        orphans.append(run_id)
        return fault(session, real_commit)
    monkeypatch.setattr(publish, "create_check", create_check)
    monkeypatch.setattr(Session, "commit", commit)
    return orphans


def postgres_goes_away_at_the_commit_after_a_check_run(monkeypatch) -> list[int]:
    """That commit meets a dead connection: its PostgreSQL backend is terminated just before."""
    from tests.bot.conftest import _pg_connect

    def terminated(session, commit):
        pid = session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar()
        admin = _pg_connect()
        admin.cursor().execute("SELECT pg_terminate_backend(%s)", (pid,))
        admin.close()
        return commit(session)
    return at_the_commit_after_a_check_run(monkeypatch, terminated)


def its_answer_lost_at_the_commit_after_a_check_run(monkeypatch) -> list[int]:
    """That commit is stored, and its answer lost: the connection drops after COMMIT reached the server."""
    from sqlalchemy.exc import OperationalError

    def stored_answer_lost(session, commit):
        commit(session)
        raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))
    return at_the_commit_after_a_check_run(monkeypatch, stored_answer_lost)


def test_a_check_run_whose_evaluation_could_not_be_committed_is_not_left_queued(settings, celery_worker, github,
                                                                                remote, send, monkeypatch):
    """The check run is created on GitHub, then the evaluation is committed: when that commit fails (PostgreSQL
    gone, a serialization failure), nothing refers to the check run any more, and it stayed `queued` on the
    PR for ever beside the one the delivery's retry created. It is completed (cancelled: never green without a
    verdict) saying why, by the failing handler itself, before any retry (the retry's sweep of stray check runs is
    the second line, for a withdrawal GitHub refused: `test_a_check_run_github_will_not_withdraw_...`); the retry's
    check run carries the verdict."""
    remote.commit("changes", "speed up (xl)")
    orphans = postgres_goes_away_at_the_commit_after_a_check_run(monkeypatch)
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: (delivery(d).attempts or 0) >= 1, what="the failed commit recorded on the delivery")
    monkeypatch.undo()
    assert orphans and "OperationalError" in delivery(d).last_error
    assert delivery(d).processed_at is None  # not retried yet: what follows is the failing handler's own doing
    assert github.check_runs[orphans[0]]["status"] == "completed", github.check_runs[orphans[0]]
    drain_until(lambda: processed(d), settings, what="the delivery retried")
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="the evaluation")
    (ev,) = evaluations()
    runs = {run_id: (r["status"], r["conclusion"]) for run_id, r in github.check_runs.items()}
    assert runs == {orphans[0]: ("completed", "cancelled"), ev.check_run_id: ("completed", "success")}, runs
    from bot.render import unrecorded_check_output
    assert github.check_runs[orphans[0]]["output"] == unrecorded_check_output()


# ---- GitHub outages and connection resets ------------------------------------------------------------

def test_github_outage_is_recorded_retried_and_lands_once(settings, celery_worker, github, remote, send):
    remote.commit("changes", "speed up (xl)")
    github.outage(6.0)
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: (delivery(d).attempts or 0) >= 1, what="failure recorded")
    row = delivery(d)
    assert row.processed_at is None and row.failed_at is None and "503" in (row.last_error or "")
    assert row.next_attempt_at is not None  # backoff scheduled
    drain_until(lambda: processed(d), settings, timeout=60, what="handled after the outage")
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="evaluation")
    assert len(stickies(github)) == 1 and len(evaluations()) == 1
    assert github.outages_served > 0


def test_connection_reset_after_a_write_is_retried_without_a_duplicate_comment(settings, celery_worker, github,
                                                                              remote, send):
    """GitHub applied the write but the answer was lost (ECONNRESET): retried, the comment adopted, not doubled."""
    remote.commit("changes", "speed up (xl)")
    github.resets = 3  # the check run, the comment ... each reset once, after the server applied it
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    drain_until(lambda: processed(d), settings, timeout=60, what="handled despite the resets")
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="evaluation")
    assert github.resets_done == 3
    assert len(stickies(github)) == 1, [c["body"][:80] for c in stickies(github)]
    assert delivery(d).attempts >= 1


# ---- 4. replays and approvals -----------------------------------------------------------------------

def test_a_captured_body_replayed_under_new_delivery_ids_queues_nothing(settings, celery_worker, github, remote,
                                                                       client):
    remote.commit("changes", "speed up (xl)")
    body = json.dumps(pr_payload(github, remote, "opened")).encode()
    first = client.post("/webhook", content=body, headers=signed_headers(body, "pull_request"))
    wait_until(lambda: processed(first.json()["delivery"]), what="first handled")
    wait_until(lambda: not evaluations()[0].state.active, what="evaluation done")
    for _ in range(3):
        r = client.post("/webhook", content=body, headers=signed_headers(body, "pull_request"))
        assert (r.status_code, r.json()["status"]) == (200, "duplicate")
    # The same event with another body (GitHub's own resend of a reopened, say) for a measured head:
    reopened = pr_payload(github, remote, "reopened")
    r2 = client.post("/webhook", content=json.dumps(reopened).encode(),
                     headers=signed_headers(json.dumps(reopened).encode(), "pull_request"))
    wait_until(lambda: processed(r2.json()["delivery"]), what="reopened handled")
    assert len(evaluations()) == 1


def test_eval_approves_the_head_pushed_before_the_comment_or_the_named_sha(settings, celery_worker, github, remote,
                                                                           send):
    remote.commit("changes", "outsider's first (xl)")
    opened = pr_payload(github, remote, "opened", author="outsider")
    opened["pull_request"]["updated_at"] = iso(datetime.now(timezone.utc) - timedelta(minutes=10))
    d = send("pull_request", opened).json()["delivery"]
    wait_until(lambda: processed(d), what="opened handled")
    assert stored_pull().awaiting_approval and not evaluations()
    # The maintainer reads the PR and comments /eval; just before that is handled, the outsider pushes.
    comment = comment_payload(github, 2, "/eval", "maintainer")
    comment["comment"]["created_at"] = iso(datetime.now(timezone.utc) - timedelta(minutes=1))
    sha2 = remote.commit("changes", "outsider's sneaky push (slow)")
    push = pr_payload(github, remote, "synchronize", author="outsider")
    push["pull_request"]["updated_at"] = iso(datetime.now(timezone.utc))
    github.repos["codertocat/hello-world"].pulls[2].updated_at = push["pull_request"]["updated_at"]
    dp = send("pull_request", push).json()["delivery"]
    wait_until(lambda: processed(dp), what="push handled")
    dc = send("issue_comment", comment).json()["delivery"]
    wait_until(lambda: processed(dc), what="comment handled")
    assert "nothing queued" in processed(dc).outcome
    assert not evaluations()
    # `/eval <sha>` names what the maintainer looked at: that approves it.
    named = comment_payload(github, 2, f"/eval {sha2[:10]}", "maintainer")
    dn = send("issue_comment", named).json()["delivery"]
    wait_until(lambda: processed(dn), what="named /eval handled")
    wait_until(lambda: evaluations(), what="evaluation queued")
    assert [e.head_sha for e in evaluations()] == [sha2] and evaluations()[0].requested_by == "maintainer"


# ---- 3. forged broker messages --------------------------------------------------------------------

def test_broker_messages_without_a_stored_delivery_or_a_worker_key_do_nothing(settings, celery_worker, github,
                                                                              remote, send):
    from bot.queue.app import celery_app
    from worker.queue.tasks import result_mac, sign_result
    from bot.testing.fake_evaluation import result_for
    app = celery_app()
    remote.commit("changes", "block until released")
    # A handle_delivery for a delivery nobody signed: nothing stored under that id, nothing happens.
    forged = app.send_task("tokengate.handle_delivery", args=["forged-1", "pull_request",
                                                              pr_payload(github, remote, "opened")],
                           queue="publish")
    assert "not stored" in forged.get(timeout=20)
    assert evaluations() == []
    # A queued evaluation (blocked on the GPU side), then forged results for it.
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: processed(d) and evaluations(), what="evaluation dispatched")
    (ev,) = evaluations()
    xl = result_for("xl", repo="Codertocat/Hello-World", pr=2, base_sha=ev.base_sha, head_sha=ev.head_sha).to_dict()
    attempts = {
        "unsigned": xl,
        "wrong key": {**xl, "_auth": {"worker": "test-gpu", "mac": result_mac("not-the-key", xl, ev.id,
                                                                                ev.celery_task_id)}},
        "unknown worker": {**xl, "_auth": {"worker": "gpu9", "mac": result_mac("k", xl, ev.id, ev.celery_task_id)}},
        "signed for another evaluation": sign_result(xl, {"eval_id": ev.id + 1}, ev.celery_task_id),
    }
    for name, result in attempts.items():
        out = app.send_task("tokengate.publish_result", args=[result, ev.id, ev.celery_task_id],
                            queue="publish").get(timeout=20)
        assert "refused" in out, (name, out)
        assert evaluations()[0].state.active and evaluations()[0].verdict is None, name
    stale = app.send_task("tokengate.publish_result", args=[sign_result(xl, {"eval_id": ev.id}, "old-task"),
                                                            ev.id, "old-task"], queue="publish").get(timeout=20)
    assert "stale attempt" in stale
    import redis
    redis.Redis.from_url(settings.broker_url).set(
        f"{settings.redis_key_prefix}tokengate:result:release:{ev.head_sha}", 1, ex=60)
    wait_until(lambda: not evaluations()[0].state.active, what="the real, signed result")
    assert evaluations()[0].result_worker == "test-gpu" and evaluations()[0].verdict == "XL"


# ---- 5. every real payload, and hostile ones --------------------------------------------------------

def test_every_github_example_payload_is_handled(settings, celery_worker, github, client):
    names = sorted(p.stem for p in PAYLOADS.glob("*.json"))
    assert len(names) == 15
    ids = {}
    for name in names:
        body = (PAYLOADS / f"{name}.json").read_bytes()  # GitHub's bytes as they are
        r = client.post("/webhook", content=body, headers=signed_headers(body, name.split(".")[0]))
        assert r.status_code in (200, 202), (name, r.text)
        if r.json().get("status") == "queued":
            ids[name] = r.json()["delivery"]
    assert len(ids) == 14  # check_suite is not ours: acknowledged, not stored
    wait_until(lambda: all(processed(d) for d in ids.values()), timeout=60, what="every example handled")
    for name, d in ids.items():
        row = delivery(d)
        assert row.failed_at is None and row.attempts == 0, (name, row.last_error)


def test_a_repository_is_its_id_renamed_or_re_created(settings, celery_worker, github, remote, send):
    """GitHub's examples name Codertocat/Hello-World with id 186853002; our server's has another id (deleted
    and re-created); then it is renamed. Every event is handled, under the id GitHub sends."""
    from bot.db.models import Repository
    example = json.loads((PAYLOADS / "pull_request.labeled.json").read_text())
    d0 = send("pull_request", example).json()["delivery"]
    wait_until(lambda: processed(d0), what="example handled")
    remote.commit("changes", "speed up (xl)")
    d1 = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: processed(d1), what="re-created repository handled")
    assert delivery(d1).attempts == 0 and "queued" in processed(d1).outcome
    renamed = pr_payload(github, remote, "labeled", label="not-ours")
    renamed["repository"]["full_name"] = "Codertocat/Renamed"
    d2 = send("pull_request", renamed).json()["delivery"]
    wait_until(lambda: processed(d2), what="renamed repository handled")
    with session_scope() as s:
        names = {r.id: r.full_name for r in s.scalars(select(Repository))}
    assert names[1296269] == "Codertocat/Renamed" and names[186853002].startswith("Codertocat/Hello-World (gone")


def test_hostile_payloads_are_answered_and_handled_without_a_crash(settings, celery_worker, github, remote,
                                                                   client, send):
    remote.commit("changes", "speed up (xl)")
    nasty = pr_payload(github, remote, "opened")
    nasty["pull_request"]["title"] = "NUL \x00 in the title"
    nasty["pull_request"]["user"] = None  # a deleted account
    nasty["pull_request"]["labels"] = [None]
    nasty["sender"] = None
    d = send("pull_request", nasty).json()["delivery"]
    comment = comment_payload(github, 2, "/eval\x00", "maintainer")
    comment["comment"]["user"] = None
    dc = send("issue_comment", comment).json()["delivery"]
    wait_until(lambda: processed(d) and processed(dc), what="hostile payloads handled")
    assert delivery(d).attempts == 0 and "\x00" not in stored_pull().title
    body = b'{"zen": "x"}'
    long_id = client.post("/webhook", content=body, headers=signed_headers(body, "ping", "x" * 65))
    assert long_id.status_code == 400
    for bad in (b"[]", b"not json", b'{"action": null}'):
        r = client.post("/webhook", content=bad, headers=signed_headers(bad, "pull_request"))
        assert r.status_code in (400, 202), bad
    settings.webhook_max_body_bytes = 64 * 1024
    big = b'{"pad": "' + b"x" * (128 * 1024) + b'"}'
    assert client.post("/webhook", content=big, headers=signed_headers(big, "ping")).status_code == 413

    def chunks():  # no Content-Length: the stream is cut at the cap, not read whole
        for _ in range(64):
            yield b"x" * 4096
    headers = signed_headers(big, "ping")
    assert client.post("/webhook", content=chunks(), headers=headers).status_code == 413


def test_a_handler_failure_is_recorded_on_the_row_and_retried(settings, celery_worker, github, remote, send,
                                                              monkeypatch):
    from bot import handlers
    remote.commit("changes", "speed up (xl)")
    calls = []
    real = handlers.Handlers.pull_request

    def flaky(self, session, payload):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug met a payload")
        return real(self, session, payload)
    monkeypatch.setattr(handlers.Handlers, "pull_request", flaky)
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: delivery(d).attempts == 1, what="failure recorded")
    assert "a bug met a payload" in delivery(d).last_error and delivery(d).processed_at is None
    with session_scope() as s:
        s.get(Delivery, d).next_attempt_at = datetime.now(timezone.utc)  # backoff elapsed
    drain_until(lambda: processed(d), settings, what="retried")
    assert len(calls) == 2


# ---- 6. operable ------------------------------------------------------------------------------------

def test_readiness_and_metrics(settings, celery_worker, github, remote, client, send):
    assert client.get("/readyz").json() == {"status": "ready"}
    remote.commit("changes", "speed up (xl)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="evaluation")
    text = client.get("/metrics").text
    for name in ('tokengate_deliveries_total{event="pull_request",outcome="queued"}', "tokengate_queue_depth",
                 'tokengate_verdicts_total{verdict="XL"} 1.0', "tokengate_evaluation_duration_seconds_bucket",
                 "tokengate_infra_total", "tokengate_github_api_errors_total",
                 "tokengate_github_rate_limit_remaining", "tokengate_deliveries_pending"):
        assert name in text, name


def test_serve_refuses_the_development_secret_unless_on_loopback(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENGATE_")}
    env.update(PYTHONPATH=str(ROOT), TOKENGATE_APP_ID="1", TOKENGATE_PRIVATE_KEY="unused")
    out = subprocess.run([sys.executable, "-m", "bot.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode != 0 and "placeholder" in out.stderr


def test_production_defaults_notice_a_dead_gpu_worker_within_30_s():
    from bot.settings import Settings
    s = Settings()
    # The heartbeat lapses ≤ ttl after the kill; the watchdog needs the task older than lost_after and looks
    # every interval (plus its 0.5 s second look).
    assert max(s.heartbeat_ttl_s, s.watchdog_lost_after_s) + s.watchdog_interval_s + 0.5 <= 30


# ---- merge-first rounds: one repository's round that cannot be closed ---------------------------------------

@pytest.mark.parametrize("listed", ["first", "after"])
def test_a_round_that_cannot_be_closed_neither_holds_up_nor_undoes_another_repositorys(
        settings, celery_worker, github, remote, send, listed):
    """Two repositories' rounds are due at one beat; one repository was removed from the installation (no
    installation on record: its round cannot be closed, the beat raises NoInstallation for it). The beat closed
    every due round in one transaction: listed first, that round stopped every other repository's for good; listed
    after, it rolled back a round whose winner GitHub had already merged (the round stayed open, its winner
    unrecorded, and the next beat found the PR closed). Each round is closed (and stored) on its own."""
    from sqlalchemy import update

    from bot.db.models import Repository, Round, utcnow
    from bot.enums import RoundState
    from bot.queue.tasks import close_due_rounds
    from tests.bot.helpers import finished

    def removed_repository():
        with session_scope() as s:
            s.add(Repository(id=424242, full_name="Codertocat/Removed", installation_id=None))
            s.flush()
            s.add(Round(repository_id=424242, closes_at=utcnow()))
    if listed == "first":
        removed_repository()
    remote.commit("changes", "speed up (xl)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="the evaluation")
    if listed == "after":
        removed_repository()
    with session_scope() as s:
        s.execute(update(Round).values(closes_at=utcnow()))  # every window has ended
    plans = close_due_rounds()
    assert [p.splitlines()[-1].strip() for p in plans] == ["winner: #2"], plans
    assert [r.status for r in github.requests_for("pulls/merge")] == [200]
    with session_scope() as s:
        rows = [(r.repository_id, r.state, r.winner_pull_request_id is not None)
                for r in s.scalars(select(Round).order_by(Round.id))]
    assert sorted(rows) == [(424242, RoundState.OPEN, False), (1296269, RoundState.CLOSED, True),
                            (1296269, RoundState.OPEN, False)], rows
    assert close_due_rounds() == [] and len(github.requests_for("pulls/merge")) == 1


@pytest.mark.parametrize("failure", ["github_502", "process_killed"])
def test_a_round_whose_closer_fails_after_its_merge_has_that_one_winner(settings, celery_worker, github, remote,
                                                                        send, monkeypatch, failure):
    """#3 (+60 %) is merged; then the very next write fails (the winner's label: GitHub's 502, or the process
    killed there). The round was written closed only in the transaction that failed: it stayed open with no
    winner recorded, and once #2 was measured against the new main (here a maintainer's /eval rerun) the next
    beat merged #2 as well: two winners in one round. The merge is stored as soon as GitHub has made it, and a
    notice GitHub fails costs nothing after it."""
    from github import GithubException

    from bot.db.models import Round
    from bot.enums import RoundState
    from bot.github import publish
    from bot.queue.tasks import close_due_rounds
    two_measured_prs_and_a_due_round(github, remote, send)

    def label_fails(*args, **kwargs):
        if failure == "process_killed":
            raise KeyboardInterrupt("the beat's process is killed here")  # nothing after it runs
        raise GithubException(502, {"message": "Server Error"}, None)
    with monkeypatch.context() as down:
        down.setattr(publish, "add_label", label_fails)
        if failure == "process_killed":
            with pytest.raises(KeyboardInterrupt):
                close_due_rounds()
        else:
            close_due_rounds()
    assert [r.status for r in github.requests_for("pulls/merge")] == [200]
    if failure == "github_502":  # the label's failure stops neither the notices nor #2's re-run
        repo = github.repos["codertocat/hello-world"]
        assert sum("#3" in c["body"] and "moved" in c["body"] for c in github.comments_on(repo, 2)) == 1
    d = send("issue_comment", comment_payload(github, 2, "/eval rerun", "maintainer")).json()["delivery"]
    wait_until(lambda: processed(d), what="the /eval rerun of #2")
    wait_until(lambda: all(not e.state.active for e in evaluations()), what="#2 measured against the new main")
    close_due_rounds()
    assert [r.status for r in github.requests_for("pulls/merge")] == [200]
    with session_scope() as s:
        rounds = [(r.state, r.winner_pull_request_id) for r in s.scalars(select(Round).order_by(Round.id))]
        three = s.scalar(select(PullRequest.id).where(PullRequest.number == 3))
    assert rounds == [(RoundState.CLOSED, three), (RoundState.OPEN, None)], rounds


def test_a_failed_handler_takes_back_only_its_own_claim_and_a_refused_handle_task_counts_nothing(settings):
    """The drain cleared a lapsed claim and handed the delivery out again; the new handler claimed it. The old
    handler then fails: its `_failed` must leave the new claim alone (taken back, the drain would hand the
    delivery out a third time beside the live handler). A handle task refused for a live claim is not counted
    as handled. Its own claim, the failing handler takes back (the delivery is retried after the backoff)."""
    from bot import metrics
    from bot.queue.tasks import _failed, _handle
    now = datetime.now(timezone.utc)
    with session_scope() as s:
        s.add(Delivery(id="d-claims", event="ping", body=b'{"zen": "x"}', body_sha256="d-claims", received_at=now,
                       attempts=0, outcome=f"{outbox.HANDLING} (claim new)",
                       next_attempt_at=now + timedelta(seconds=600)))
    counted = {o: metrics.HANDLED.labels("ping", o)._value.get() for o in ("processed", "retry", "failed")}
    assert "being handled by another task" in _handle("d-claims")
    assert "being handled by another task" in _handle("d-claims")
    _failed("d-claims", RuntimeError("the old handler fails"), settings, f"{outbox.HANDLING} (claim old)")
    row = delivery("d-claims")
    assert (row.outcome, row.attempts, row.processed_at) == (f"{outbox.HANDLING} (claim new)", 0, None)
    assert {o: metrics.HANDLED.labels("ping", o)._value.get() for o in counted} == counted
    _failed("d-claims", RuntimeError("the new handler fails"), settings, f"{outbox.HANDLING} (claim new)")
    row = delivery("d-claims")
    assert (row.outcome, row.attempts, "new handler fails" in row.last_error) == (None, 1, True)


def test_a_merge_whose_answer_github_lost_is_still_the_rounds_winner(settings, celery_worker, github, remote, send):
    """GitHub merges #3, then the connection is reset before its answer arrives; the client sends the PUT again and
    GitHub answers 405 (merged already). The round called that 'GitHub refused the merge' and closed without a
    winner: #3's merge unrecorded, no winner comment or label, #2 not told why main moved. A refusal for a PR
    GitHub shows merged at the evaluated head is the round's own merge."""
    from bot.queue.tasks import close_due_rounds
    two_measured_prs_and_a_due_round(github, remote, send)
    github.resets = 1  # the round's first write is the merge: applied, its answer lost
    (plan,) = close_due_rounds()
    assert github.resets_done == 1 and [r.status for r in github.requests_for("pulls/merge")] == [200, 405]
    assert plan.splitlines()[-1].strip() == "winner: #3", plan
    repo = github.repos["codertocat/hello-world"]
    assert sum("merge-first winner" in c["body"] for c in github.comments_on(repo, 3)) == 1
    assert sum("#3" in c["body"] and "moved" in c["body"] for c in github.comments_on(repo, 2)) == 1
    wait_until(lambda: all(not e.state.active for e in evaluations()), what="#2 re-evaluated against the new main")
    assert evaluations()[-1].base_sha == remote.git("rev-parse", "main")


def test_an_evaluation_whose_commit_was_stored_but_its_answer_lost_goes_on(settings, celery_worker, github, remote,
                                                                         send, monkeypatch):
    """The connection drops after COMMIT reached PostgreSQL: the evaluation and its attempt are stored, the
    session sees an error. The check run was withdrawn (cancelled, though the stored evaluation refers to it) and
    the error raised before the task was sent: the delivery's retry found the attempt queued and sent, so nothing
    ran it until the watchdog called it lost, an INFRA attempt charged to the PR. Now the stored commit is found
    and the dispatch goes on."""
    remote.commit("changes", "speed up (xl)")
    lost = its_answer_lost_at_the_commit_after_a_check_run(monkeypatch)
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="the evaluation")
    monkeypatch.undo()
    (ev,) = evaluations()
    assert lost == [ev.check_run_id] and (ev.state, ev.attempt, ev.verdict) == (EvalState.DONE, 1, "XL")
    assert github.check_runs[ev.check_run_id]["conclusion"] == "success"
    wait_until(lambda: processed(d), what="the delivery processed")
    assert (delivery(d).attempts or 0) == 0, delivery(d).last_error


def test_a_stored_commit_whose_answer_was_lost_while_the_database_restarts_is_sent_by_the_retry(
        settings, celery_worker, github, remote, send, monkeypatch):
    """The commonest way a COMMIT's answer is lost: PostgreSQL goes down (restart, fail-over) right after the COMMIT
    reached it. The read-back meets the database still away and cannot tell: the check run is withdrawn and the
    error raised before the task is sent. The delivery's retry found the attempt stored as sent and sent nothing:
    it waited until the watchdog called it lost, an INFRA attempt charged to the PR (a round never takes a winner
    measured after one). The retry finds its own attempt's task nowhere and sends it, under a new check run.
    (Found by the red team.)"""
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    import bot.service as service_mod
    remote.commit("changes", "speed up (xl)")
    lost, probes = its_answer_lost_at_the_commit_after_a_check_run(monkeypatch), []

    class StillRestarting(Session):  # the read-back's connection: PostgreSQL is not accepting connections yet
        def scalar(self, *args, **kwargs):
            if not probes:
                probes.append(1)
                raise OperationalError("SELECT", {}, Exception("the database system is starting up"))
            return super().scalar(*args, **kwargs)
    monkeypatch.setattr(service_mod, "Session", StillRestarting)
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: lost and probes, what="the commit's answer lost and the read-back refused")
    monkeypatch.undo()
    monkeypatch.setattr(settings, "send_in_flight_s", 0.0)  # the retry comes seconds after the first handling
    drain_until(lambda: processed(d), settings, what="the delivery retried")  # the database is back
    wait_until(lambda: not evaluations()[0].state.active, what="the evaluation")
    (ev,) = evaluations()
    runs = {run_id: (r["status"], r["conclusion"]) for run_id, r in github.check_runs.items()}
    assert (ev.state, ev.attempt, ev.verdict, runs[ev.check_run_id]) == (
        EvalState.DONE, 1, "XL", ("completed", "success")), runs
    assert runs[lost[0]] == ("completed", "cancelled") and len(runs) == 2, runs  # none left queued


def test_a_check_run_github_will_not_withdraw_is_completed_by_the_retrys_dispatch(settings, celery_worker, github,
                                                                                remote, send, monkeypatch):
    """The evaluation's commit fails (PostgreSQL gone) and GitHub also refuses to complete the check run created
    before it (a 422; a 503 is the same). The withdraw is best effort: the commit's error is the delivery's (it is
    retried and the evaluation made), never GitHub's refusal (which would have marked the delivery processed as
    'GitHub error 422', with no evaluation). The retry's dispatch finds the check run no evaluation refers to and
    completes it: it is not left `queued` for ever beside the verdict."""
    from github import GithubException

    from bot.github import publish
    remote.commit("changes", "speed up (xl)")
    orphans = postgres_goes_away_at_the_commit_after_a_check_run(monkeypatch)
    real_complete = publish.complete_check

    def complete_check(repo, check_run_id, *args, **kwargs):
        if check_run_id in orphans:
            raise GithubException(422, {"message": "Validation Failed"}, None)
        return real_complete(repo, check_run_id, *args, **kwargs)
    monkeypatch.setattr(publish, "complete_check", complete_check)
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: (delivery(d).attempts or 0) >= 1, what="the failed commit recorded on the delivery")
    monkeypatch.undo()
    assert orphans and "OperationalError" in delivery(d).last_error and not processed(d)
    drain_until(lambda: processed(d), settings, what="the delivery retried")
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="the evaluation")
    (ev,) = evaluations()
    assert ev.state is EvalState.DONE and ev.check_run_id != orphans[0]
    stray = github.check_runs[orphans[0]]
    assert (stray["status"], stray["conclusion"]) == ("completed", "cancelled"), stray  # by the retry's dispatch


@pytest.mark.parametrize("where", ["queue", "worker", "backend", "unseen_broker", "other_delivery", "claimed",
                                   "infra_retry", "young"])
def test_an_attempt_its_delivery_finds_again_is_sent_again_only_when_its_task_is_nowhere(settings, monkeypatch, where):
    """A delivery's retry after its handler sent the task (and then failed on GitHub) must not send it again:
    the evaluation would lose its place in the GPU queue and run twice. Only this very delivery's own attempt
    (attempt 1: a later one is an INFRA retry's, whose dispatcher may still be publishing it), unclaimed, stored
    as sent at least `send_in_flight_s` ago, whose task the broker, the workers' heartbeats and the result backend
    all lack, twice, is sent."""
    import types

    import bot.service as service_mod
    from bot.db.models import Evaluation, utcnow
    from bot.queue.outbox import HANDLING_DELIVERY

    class Probe(service_mod.TaskProbe):  # its own `anywhere` over these lookups
        def __init__(self, celery, keys):
            self.client = None if where == "unseen_broker" else object()

        def in_broker(self, task):
            return where == "queue"

        def beating(self, task, claimed_by=None):
            return where == "worker"

        def finished(self, task):
            return ("SUCCESS", {}, None) if where == "backend" else None
    monkeypatch.setattr(service_mod, "TaskProbe", Probe)
    monkeypatch.setattr(service_mod, "RECHECK_S", 0)
    ev = Evaluation(id=7, state=EvalState.QUEUED, delivery_id="d-1", celery_task_id="t-1",
                    claimed_by="gpu-a" if where == "claimed" else None, attempt=2 if where == "infra_retry" else 1,
                    dispatched_at=utcnow() - timedelta(seconds=5 if where == "young" else 60))
    session = types.SimpleNamespace(info={HANDLING_DELIVERY: "d-2" if where == "other_delivery" else "d-1"})
    service = service_mod.Service(settings, celery=object())
    if where == "young":  # its first handler may still be publishing it: the delivery looks again later
        with pytest.raises(TimeoutError, match="looks again later"):
            service._own_attempt_never_sent(session, ev)
        return
    assert service._own_attempt_never_sent(session, ev) is False
    monkeypatch.setattr(Probe, "__init__", lambda self, c, k: setattr(self, "client", object()))
    if where in ("queue", "worker", "backend", "unseen_broker"):  # the same attempt, its task nowhere: sent
        where = "nowhere"
        assert service._own_attempt_never_sent(session, ev) is True
