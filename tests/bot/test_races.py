"""Concurrency red team: two actors on one pull request at the same moment, made deterministic by running
the second actor (in its own thread and database session) at a chosen point inside the first. Real
PostgreSQL, Redis, the test GitHub server and git remote."""
from __future__ import annotations

import threading

import pytest
import redis

from bot.db.engine import session_scope
from bot.enums import EvalState
from bot.github import publish
from bot.handlers import Handlers
from bot.service import Service
from tests.bot.conftest import pr_payload, wait_until
from tests.bot.helpers import evaluations, finished
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

