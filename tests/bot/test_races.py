"""Concurrency red team: two actors on one pull request (or one round) at the same moment, made deterministic
by running the second actor (in its own thread and database session) at a chosen point inside the first. Real
PostgreSQL, Redis, the test GitHub server and git remote."""
from __future__ import annotations

import threading

import pytest
import redis
from sqlalchemy import select

from bot import rounds
from bot.db.engine import session_scope
from bot.db.models import Round
from bot.enums import EvalState, RoundState
from bot.github import publish
from bot.handlers import Handlers
from bot.queue.app import celery_app
from bot.service import Service
from tests.bot.conftest import pr_payload, wait_until
from tests.bot.helpers import evaluations, finished, gpu_sends, stored_not_handled, two_measured_prs_and_a_due_round
from tests.bot.test_rounds import close

pytestmark = pytest.mark.services


def in_thread(fn) -> None:
    """Run fn in another thread (its own session), to the end; its exception is raised here."""
    errors: list[BaseException] = []

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the concurrent actor did not finish (waiting for a lock the other holds?)"
    if errors:
        raise errors[0]


def release(settings, sha: str) -> None:
    redis.Redis.from_url(settings.broker_url).set(f"{settings.redis_key_prefix}tokengate:result:release:{sha}", 1,
                                                  ex=60)


def test_a_push_to_a_loser_while_the_round_closes_keeps_its_new_heads_evaluation(settings, celery_worker, github,
                                                                                remote, send, monkeypatch):
    """#3 (+60 %) wins, #2 (+45 %) loses. Between the round reading its candidates and re-evaluating #2 against
    the new main, #2's author pushes and that synchronize is handled (its new head's evaluation queued). The
    round must not re-evaluate #2's old head with its stale copy of the row: that superseded the new head's
    evaluation and queued one of a head that is no longer the PR's, whose result is then ignored forever."""
    for number, branch, message in ((2, "a", "fast (xl:45)"), (3, "b", "faster (xl:60)")):
        remote.commit(branch, message)
        send("pull_request", pr_payload(github, remote, "opened", number=number, head_ref=branch))
        wait_until(finished(number - 1), what=f"evaluation of #{number}")
    old_head = remote.git("rev-parse", "a")
    real_reply = publish.reply
    pushed: list[str] = []

    def push_then_reply(repo, number, body):
        if number == 2 and not pushed:  # the round tells #2 that main moved; #2's push lands right then
            pushed.append(remote.commit("a", "more work (block)"))
            payload = pr_payload(github, remote, "synchronize", number=2, head_ref="a")

            def handle():
                with session_scope() as s:
                    Handlers(Service()).dispatch(s, "pull_request", payload)
            in_thread(handle)
        return real_reply(repo, number, body)
    monkeypatch.setattr(publish, "reply", push_then_reply)
    plan = close(dry_run=False)
    monkeypatch.undo()
    assert plan.winner == 3 and pushed
    new_head = pushed[0]
    mine = [e for e in evaluations() if e.head_sha in (old_head, new_head) and e.id > 2]
    # The new head's evaluation is alive (not superseded by the round), and nothing was queued for the old head.
    assert [(e.head_sha, e.state.active) for e in mine] == [(new_head, True)], \
        [(e.head_sha[:7], e.state.value, e.trigger.value) for e in mine]
    release(settings, new_head)
    wait_until(lambda: all(not e.state.active for e in evaluations()), what="every evaluation finished")
    assert [e.state for e in evaluations() if e.head_sha == new_head] == [EvalState.DONE]


# ---- the broker refuses the GPU task after the evaluation was committed --------------------------------------

def test_a_gpu_task_the_broker_refused_is_sent_again_by_the_deliverys_retry(settings, celery_worker, github, remote,
                                                                           send, monkeypatch):
    """Redis refused the evaluation task after its attempt was committed: the delivery fails and is retried, and
    that retry must send the task (the same attempt: nothing was evaluated). It found the attempt `queued` and
    did nothing: the evaluation waited for a task that never existed until the watchdog called the message
    lost, charging the PR an INFRA attempt (so its tier, measured after one, never entered a round)."""
    from tests.bot.test_faults import delivery, drain_until
    from tests.bot.helpers import processed
    remote.commit("changes", "speed up (xl)")
    _, refused = gpu_sends(monkeypatch, refuse=1)
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: (delivery(d).attempts or 0) >= 1, what="the refused send recorded on the delivery")
    assert refused and "Connection refused" in delivery(d).last_error
    drain_until(lambda: processed(d), settings, what="the delivery retried")
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="the evaluation run")
    (ev,) = evaluations()
    assert (ev.state, ev.attempt, ev.verdict) == (EvalState.DONE, 1, "XL")
    runs = [r for r in github.check_runs.values() if r["head_sha"] == ev.head_sha]
    assert [(r["status"], r["conclusion"]) for r in runs] == [("completed", "success")], runs
    labels = github.repos["codertocat/hello-world"].pulls[2].labels
    assert "eval:XL" in labels and "eval:INFRA" not in labels, labels


def test_a_retry_the_broker_refused_is_sent_again_by_the_watchdog(settings, celery_worker, github, remote, send,
                                                                 monkeypatch):
    """The first attempt came back INFRA and the retry's task was refused by Redis inside the result's task
    (which nothing retries: its next run would be a stale attempt). The watchdog sends that attempt again at
    its next look, not after its grace as a lost message (the PR's last attempt, INFRA for the broker's outage),
    and its check run is the one completed."""
    from bot.queue import watchdog
    remote.commit("changes", "speed up (flaky)")  # INFRA on attempt 1, then XL
    _, refused = gpu_sends(monkeypatch, refuse=1, after=1)  # attempt 1 is sent, the retry refused
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(lambda: refused and evaluations()[0].attempt == 2 and evaluations()[0].dispatched_at is None,
               what="the retry's send refused")
    monkeypatch.undo()
    (ev,) = evaluations()
    assert ev.state is EvalState.QUEUED
    service = Service()
    with session_scope() as s:
        findings = watchdog.inspect_active(s, settings, watchdog.TaskProbe(celery_app(), settings.worker_keys))
    assert [(f.eval_id, f.action) for f in findings] == [(ev.id, "resend")]
    with session_scope() as s:
        assert "sent again" in watchdog.act(s, service, findings[0])
    wait_until(lambda: not evaluations()[0].state.active, what="the retry run")
    (ev,) = evaluations()
    assert (ev.state, ev.attempt, ev.verdict) == (EvalState.DONE, 2, "XL")
    runs = [r for r in github.check_runs.values() if r["head_sha"] == ev.head_sha]
    assert [(r["status"], r["conclusion"]) for r in runs] == [("completed", "action_required"),
                                                              ("completed", "success")], runs


# ---- two beats close the same due round ------------------------------------------------------------------------

def beat() -> list:
    """One beat's round task (its own session): close every due round; the plans of those it closed."""
    with session_scope() as s:
        return rounds.close_due_rounds(s, Service())


def the_other_beat_runs_at(monkeypatch, owner, name: str) -> list[list]:
    """The first time this thread calls owner.name, the other beat runs whole first (its own thread and session).
    Returns [that beat's plans] once it has run."""
    real, me, ran = getattr(owner, name), threading.current_thread(), []

    def paused(*args, **kwargs):
        if threading.current_thread() is me and not ran:
            ran.append([])
            in_thread(lambda: ran[0].extend(beat()))
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, paused)
    return ran


PAUSES = {  # where the first beat is when the other runs whole
    "listed": lambda: (rounds, "close_round"),  # it has listed the due round, not yet started closing it
    "merging": lambda: (publish, "merge"),  # it is about to merge its winner
    "committed": lambda: (celery_app(), "send_task"),  # the loser's re-evaluation committed (every lock released)
}


@pytest.mark.parametrize("pause", PAUSES)
def test_two_beats_closing_one_round_at_once_merge_once(settings, celery_worker, github, remote, send, monkeypatch,
                                                         pause):
    """Two beats (a misconfiguration, but possible) close the same due round at once. One closes it: one merge,
    one winner comment, one re-evaluation of the loser, the round's outcome written once and the next window
    opened once. The other finds the round being closed (or closed) and does nothing. Unlocked, the second beat
    merged too (GitHub refused: 405) or closed the round again, overwriting its outcome, or closed the next
    window at once and opened a third."""
    two_measured_prs_and_a_due_round(github, remote, send)
    ran = the_other_beat_runs_at(monkeypatch, *PAUSES[pause]())
    mine = beat()
    monkeypatch.undo()
    (theirs,) = ran
    plans = mine + theirs
    assert [p.winner for p in plans] == [3], ["\n".join(p.lines()) for p in plans]
    assert [r.status for r in github.requests_for("pulls/merge")] == [200]
    repo = github.repos["codertocat/hello-world"]
    assert sum("merge-first winner" in c["body"] for c in github.comments_on(repo, 3)) == 1
    assert sum("#3" in c["body"] and "moved" in c["body"] for c in github.comments_on(repo, 2)) == 1
    with session_scope() as s:
        outcomes = [(r.state, r.outcome) for r in s.scalars(select(Round).order_by(Round.id))]
    assert outcomes == [(RoundState.CLOSED, "\n".join(plans[0].lines())), (RoundState.OPEN, None)]
    wait_until(lambda: all(not e.state.active for e in evaluations()), what="the loser's re-evaluation")
    assert [e.pull_request_id for e in evaluations()].count(evaluations()[0].pull_request_id) == 2


# ---- a dispatch commits its caller's transaction (Service._dispatch) ------------------------------------------

def after_this_thread_sends_a_gpu_task(monkeypatch, then) -> None:
    """The first time this thread sends an evaluation task, `then()` runs before it goes on: the attempt is
    committed (every row lock released) and the PR's lock not taken again yet."""
    from worker.queue.app import EVALUATE_TASK
    app, me, ran = celery_app(), threading.current_thread(), []
    real = app.send_task

    def send_task(name, *args, **kwargs):
        sent = real(name, *args, **kwargs)
        if name == EVALUATE_TASK and threading.current_thread() is me and not ran:
            ran.append(then())
        return sent
    monkeypatch.setattr(app, "send_task", send_task)


def test_a_result_published_before_the_dispatcher_locks_the_pr_again_is_not_shown_as_queued(
        settings, celery_worker, github, remote, monkeypatch):
    """The evaluation starts and finishes between the dispatch's commit and its caller taking the PR's lock again
    (a fast or cached result). The caller then refreshed the sticky comment from its own copy of the evaluation,
    read before that commit: the comment said "Queued" for ever, above a check run showing the verdict."""
    from bot.enums import Verdict, verdict_label
    from tests.bot.test_triggers import sticky
    remote.commit("changes", "speed up (xl)")
    after_this_thread_sends_a_gpu_task(monkeypatch, lambda: wait_until(finished(1), what="the result published"))
    with session_scope() as s:
        Handlers(Service()).dispatch(s, "pull_request", pr_payload(github, remote, "opened"))
    (ev,) = evaluations()
    assert ev.state is EvalState.DONE
    (note,) = sticky(github)
    assert "Queued" not in note["body"] and verdict_label(Verdict.XL) in note["body"], note["body"]


def test_a_delivery_is_handled_once_though_its_dispatch_commits_in_the_middle(settings, celery_worker, github,
                                                                               remote, send, monkeypatch):
    """A handle task holds its delivery's row lock until it stores the delivery as processed; a second handle
    task of the same delivery (the drain sends it again when the first waited in a publish backlog longer than
    outbox_redrive_after_s) waits for that lock, then finds it processed or claimed. The handler's dispatch commits
    in the middle and released that lock with the delivery not processed yet: the second task handled it again, and
    `/eval rerun`, its evaluation done meanwhile, evaluated the head a second time (a GPU run, a check run)."""
    from bot.queue.tasks import _handle
    from tests.bot.conftest import comment_payload
    remote.commit("changes", "speed up (xl)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="the first evaluation")
    d = stored_not_handled(send, monkeypatch, "issue_comment", comment_payload(github, 2, "/eval rerun", "maintainer"))
    second: list[str] = []

    def the_drains_resend_runs():
        wait_until(finished(2), what="the re-run's result")
        in_thread(lambda: second.append(_handle(d)))
    after_this_thread_sends_a_gpu_task(monkeypatch, the_drains_resend_runs)
    first = _handle(d)
    monkeypatch.undo()
    wait_until(lambda: all(not e.state.active for e in evaluations()), what="every evaluation finished")
    assert len(evaluations()) == 2, [(e.id, e.trigger.value, e.requested_by) for e in evaluations()]
    assert "evaluation 2" in first and "being handled by another task" in second[0], (first, second)


class Killed(BaseException):
    """Not an Exception: no handler code sees it, as with a SIGKILL of the worker."""


def test_a_handler_killed_after_its_dispatch_commit_is_handled_again_without_a_second_evaluation(
        settings, celery_worker, github, remote, send, monkeypatch):
    """A handler killed after its dispatch committed (the evaluation stored and sent, the delivery claimed but not
    processed) is handled again once its claim lapses, as it must be. `/eval rerun` then asked for another
    evaluation of the head its first handling had just had measured: a second GPU run and check run for one
    comment. Its evaluation now carries the delivery's id, and the second handling finds it."""
    from datetime import timedelta

    from bot.db.models import Delivery, utcnow
    from bot.queue.tasks import _handle
    from tests.bot.conftest import comment_payload
    remote.commit("changes", "speed up (xl)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="the first evaluation")
    d = stored_not_handled(send, monkeypatch, "issue_comment", comment_payload(github, 2, "/eval rerun", "maintainer"))

    def killed():
        raise Killed
    after_this_thread_sends_a_gpu_task(monkeypatch, killed)
    with pytest.raises(Killed):
        _handle(d)
    monkeypatch.undo()
    wait_until(finished(2), what="the re-run's result")
    with session_scope() as s:  # the claim lapses
        s.get(Delivery, d).next_attempt_at = utcnow() - timedelta(seconds=1)
    again = _handle(d)
    wait_until(lambda: all(not e.state.active for e in evaluations()), what="every evaluation finished")
    assert len(evaluations()) == 2, [(e.id, e.trigger.value, e.delivery_id) for e in evaluations()]
    assert evaluations()[1].delivery_id == d and again.endswith("evaluation 2"), again
    with session_scope() as s:
        assert s.get(Delivery, d).processed_at is not None


def test_a_handler_killed_between_its_dispatch_commit_and_the_send_is_handled_again_and_its_evaluation_runs(
        settings, celery_worker, github, remote, send, monkeypatch):
    """The scenario above, killed one line earlier: the dispatch's commit stored the attempt as sent (and the
    delivery's claim), then the process died (OOM, SIGKILL, a worker shutdown) before the task reached the broker.
    Handled again when its claim lapses, the delivery found its evaluation queued and returned it: nothing sent
    it, and it waited for the watchdog to call its message lost (an INFRA attempt charged to the PR, a second
    check run). Its task is nowhere, so it is sent now. (Found by the red team.)"""
    from datetime import timedelta

    from bot.db.models import Delivery, utcnow
    from bot.queue.tasks import _handle
    from worker.queue.app import EVALUATE_TASK
    remote.commit("changes", "speed up (xl)")
    monkeypatch.setattr(settings, "send_in_flight_s", 0.0)  # the claim made to lapse at once, below
    d = stored_not_handled(send, monkeypatch, "pull_request", pr_payload(github, remote, "opened"))
    app, real = celery_app(), celery_app().send_task

    def send_task(name, *args, **kwargs):
        if name == EVALUATE_TASK:
            raise Killed  # the process dies after the dispatch's commit, before the task reaches the broker
        return real(name, *args, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(app, "send_task", send_task)
        with pytest.raises(Killed):
            _handle(d)
    with session_scope() as s:  # the claim lapses
        s.get(Delivery, d).next_attempt_at = utcnow() - timedelta(seconds=1)
    _handle(d)
    wait_until(lambda: not evaluations()[0].state.active, what="the evaluation")
    (ev,) = evaluations()
    assert (ev.state, ev.attempt, ev.verdict) == (EvalState.DONE, 1, "XL")
    runs = {run_id: (r["status"], r["conclusion"]) for run_id, r in github.check_runs.items()}
    assert runs[ev.check_run_id] == ("completed", "success") and len(runs) == 2, runs
    assert all(status == "completed" for status, _ in runs.values()), runs


def test_an_operators_requeue_does_not_hand_out_a_delivery_whose_handler_holds_its_claim(
        settings, celery_worker, github, remote, send, monkeypatch):
    """While a handler holds its delivery's claim (its dispatch committed it, the handler goes on), an operator
    runs `tokengate deliveries requeue --all` (or names the delivery), and the beat's drain runs. Requeue cleared
    `next_attempt_at` under the claim: the handle task it sent found the claim without a lease and handled the
    delivery again beside the live handler (a `/eval rerun` whose evaluation had finished meanwhile ran twice),
    and the drain found the claim due and cleared it."""
    from bot.queue import outbox
    from bot.queue.tasks import _handle
    from tests.bot.conftest import comment_payload
    remote.commit("changes", "speed up (xl)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="the first evaluation")
    d = stored_not_handled(send, monkeypatch, "issue_comment", comment_payload(github, 2, "/eval rerun", "maintainer"))
    sent: list[str] = []
    monkeypatch.setattr(outbox, "send", sent.append)
    seen: dict[str, list] = {}

    def the_operator_requeues_and_the_beat_drains():
        wait_until(finished(2), what="the re-run's result")
        with session_scope() as s:
            seen["requeued"] = outbox.requeue(s, None)
        with session_scope() as s:
            seen["drained"] = outbox.drain(s, settings)
        seen["handled"] = []
        for delivery_id in list(sent):
            in_thread(lambda: seen["handled"].append(_handle(delivery_id)))
    after_this_thread_sends_a_gpu_task(monkeypatch, the_operator_requeues_and_the_beat_drains)
    first = _handle(d)
    monkeypatch.undo()
    wait_until(lambda: all(not e.state.active for e in evaluations()), what="every evaluation finished")
    assert len(evaluations()) == 2, ([(e.id, e.trigger.value) for e in evaluations()], seen)
    assert (seen["requeued"], seen["drained"]) == ([], []) and "evaluation 2" in first, (seen, first)


def test_a_deliverys_retry_does_not_send_again_an_infra_retry_its_dispatcher_is_still_sending(
        settings, celery_worker, github, remote, send, monkeypatch):
    """The delivery's first handling sent attempt 1 and then failed on GitHub (502): retried. Attempt 1 comes back
    INFRA and the publish worker dispatches attempt 2: it commits it (task Z, unclaimed), then its broker publish
    is slow (Redis latency, a fail-over). The delivery's retry ran in that window, found its evaluation queued
    with Z nowhere, twice, and sent attempt Y as well: two GPU runs of attempt 2, Y without the INFRA retry's
    backoff. A later attempt is not the delivery's own. (Found by the red team.)"""
    from celery import states
    from github import GithubException

    from bot.queue.tasks import _handle
    from worker.queue.app import EVALUATE_TASK
    remote.commit("changes", "speed up (flaky)")  # INFRA on attempt 1, then XL
    monkeypatch.setattr(settings, "send_in_flight_s", 0.0)  # only the attempt rule stands between them
    d = stored_not_handled(send, monkeypatch, "pull_request", pr_payload(github, remote, "opened"))
    app, real = celery_app(), celery_app().send_task
    me = threading.current_thread()
    sent: list[tuple[str, int]] = []
    committed, go = threading.Event(), threading.Event()

    def send_task(name, *args, **kwargs):
        if name != EVALUATE_TASK:
            return real(name, *args, **kwargs)
        job = kwargs["args"][0]
        if threading.current_thread() is not me and job["attempt"] == 2 and not committed.is_set():
            committed.set()  # the INFRA retry's dispatch committed attempt 2; its publish is slow
            go.wait(30)
        out = real(name, *args, **kwargs)
        sent.append((kwargs["task_id"], job["attempt"]))
        if threading.current_thread() is me and len(sent) == 1:
            raise GithubException(502, {"message": "Bad Gateway"}, None)  # the handler fails after its send
        return out
    monkeypatch.setattr(app, "send_task", send_task)
    first = _handle(d)
    assert first.startswith("retry"), first
    assert committed.wait(30), "attempt 2 never dispatched"
    try:
        again = _handle(d)  # the delivery's retry, while attempt 2's dispatcher is still publishing
    finally:
        go.set()
    wait_until(lambda: all(not e.state.active for e in evaluations()) and len(sent) >= 2, what="the evaluation")
    (ev,) = evaluations()
    second = [t for t, attempt in sent if attempt == 2]
    assert len(second) == 1 and (ev.state, ev.verdict) == (EvalState.DONE, "XL"), (again, sent, ev.state, ev.verdict)
    assert celery_app().AsyncResult(second[0]).state == states.SUCCESS

