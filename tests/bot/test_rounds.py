"""Merge-first: the biggest verified speedup wins; a moved head or base, or a red check, disqualifies."""
from __future__ import annotations

import pytest
from sqlalchemy import select

from bot.db.engine import session_scope
from bot.enums import RoundState
from bot.db.models import Repository, Round
from bot.rounds import close_round
from bot.service import Service
from tests.bot.conftest import pr_payload, wait_until
from tests.bot.helpers import evaluations, finished, gpu_sends

pytestmark = pytest.mark.services

WRITES = ("pulls/merge", "issues/create-comment", "issues/update-comment", "issues/set-labels", "issues/add-labels",
          "checks/create", "checks/update")


def open_three(github, remote, send):
    """PR 2: +45 %, PR 3: +60 %, PR 4: within noise — all evaluated."""
    for number, branch, message in ((2, "a", "fast (xl:45)"), (3, "b", "faster (xl:60)"), (4, "c", "tidy")):
        remote.commit(branch, message)
        send("pull_request", pr_payload(github, remote, "opened", number=number, head_ref=branch))
        wait_until(finished(number - 1), what=f"evaluation of #{number}")


def close(dry_run: bool):
    with session_scope() as s:
        repo = s.scalar(select(Repository))
        plan = close_round(s, Service(), repo, dry_run=dry_run)
        if dry_run:
            s.rollback()
    return plan


def writes(github) -> int:
    return sum(1 for r in github.requests if r.operation in WRITES)


def test_biggest_speedup_is_merged_others_told(settings, celery_worker, github, remote, send):
    open_three(github, remote, send)
    repo = github.repos["codertocat/hello-world"]
    before = writes(github)
    dry = close(dry_run=True)
    assert dry.winner == 3 and writes(github) == before  # dry run: same plan, nothing written
    assert repo.pulls[3].state == "open"

    main_before = remote.git("rev-parse", "main")
    plan = close(dry_run=False)
    assert plan.winner == 3
    assert [s.action for s in plan.steps] == ["merge", "notify"]  # #4 (no speedup) is not a contender
    merge = github.requests_for("pulls/merge")[0]
    assert merge.body["sha"] == remote.git("rev-parse", "b")
    assert repo.pulls[3].merged and remote.git("rev-parse", "main") != main_before
    assert "merge-first" in repo.pulls[3].labels
    assert any("merge-first winner" in c["body"] and "+60.0%" in c["body"] for c in github.comments_on(repo, 3))
    assert any("moved" in c["body"] and "#3" in c["body"] for c in github.comments_on(repo, 2))
    # #2 is re-evaluated against the new main.
    wait_until(lambda: len(evaluations()) == 4 and not evaluations()[-1].state.active, what="re-evaluation of #2")
    assert evaluations()[-1].base_sha == remote.git("rev-parse", "main")
    with session_scope() as s:
        states = [r.state for r in s.scalars(select(Round).order_by(Round.id))]
    assert states == [RoundState.CLOSED, RoundState.OPEN]


def test_moved_head_or_red_check_disqualifies(settings, celery_worker, github, remote, send):
    open_three(github, remote, send)
    repo = github.repos["codertocat/hello-world"]
    remote.commit("b", "one more thing")  # #3's head moved since its evaluation (webhook not yet seen)
    repo.other_checks[remote.git("rev-parse", "a")] = [{"name": "ci/tests", "status": "completed",
                                                       "conclusion": "failure"}]
    plan = close(dry_run=False)
    assert plan.winner is None
    reasons = {s.pr: s.reason for s in plan.steps}
    assert "head moved" in reasons[3] and "ci/tests: failure" in reasons[2]
    assert github.requests_for("pulls/merge") == []

    repo.other_checks.clear()
    plan = close(dry_run=False)
    assert plan.winner == 2  # #3 still has an unevaluated head


def test_moved_base_means_reevaluation_not_merge(settings, celery_worker, github, remote, send):
    open_three(github, remote, send)
    remote.commit("main", "someone merged something")
    plan = close(dry_run=False)
    assert plan.winner is None and github.requests_for("pulls/merge") == []
    assert {s.pr: s.action for s in plan.steps} == {3: "reevaluate", 2: "reevaluate"}
    wait_until(lambda: len(evaluations()) == 5 and all(not e.state.active for e in evaluations()),
               what="re-evaluations against the new main")
    new_main = remote.git("rev-parse", "main")
    assert {e.base_sha for e in evaluations()[3:]} == {new_main}
    plan = close(dry_run=False)
    assert plan.winner == 3


def round_request(base_sha: str | None = None):
    """What a round's re-evaluation of the one PR's head asks for, against `base_sha` (else its stored base)."""
    from bot.db.models import PullRequest
    from bot.enums import Trigger
    service = Service()
    with session_scope() as s:
        pr = service.lock_pull(s, s.scalar(select(PullRequest.id)))
        pr.base_sha = base_sha or pr.base_sha
        return service.request_evaluation(s, pr, Trigger.ROUND)


def test_a_rounds_request_for_a_head_and_base_already_measured_reuses_that_verdict(settings, celery_worker, github,
                                                                                   remote, send, monkeypatch):
    """A round asks to measure a loser's head against the new main when another closer's request for the same
    head and base is done already (two beats, tests/bot/test_races.py): it gets that finished evaluation, with
    no second task and no second check run. Against a base not measured yet, the head is evaluated again."""
    remote.commit("changes", "speed up (xl)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="the evaluation")
    (done,) = evaluations()
    sent, _ = gpu_sends(monkeypatch)
    checks = len(github.requests_for("checks/create"))

    reused = round_request()
    assert (reused.id, reused.state, reused.verdict) == (done.id, done.state, "XL")
    assert (sent, len(github.requests_for("checks/create")), len(evaluations())) == ([], checks, 1)

    new_main = remote.commit("main", "someone merged something")
    measured = round_request(base_sha=new_main)
    assert measured.id != done.id and (measured.head_sha, measured.base_sha) == (done.head_sha, new_main)
    assert (sent, len(github.requests_for("checks/create"))) == ([measured.celery_task_id], checks + 1)
    wait_until(finished(2), what="the evaluation against the new main")  # the next test's TRUNCATE must not meet it


def _finished(s, repo_id: int, name: str, rows) -> Repository:
    """A repository whose open PRs each have one finished evaluation of their head:
    rows of (number, profile, verdict, best_speedup, result)."""
    from bot.db.models import Evaluation, PullRequest
    from bot.enums import EvalState, Trigger

    repo = Repository(id=repo_id, full_name=name)
    s.add(repo)
    s.flush()
    for number, profile, verdict, speedup, result in rows:
        pr = PullRequest(repository_id=repo.id, number=number, author_login="a", head_sha=f"{number}" * 40,
                         head_ref=f"b{number}", base_ref="main", base_sha="0" * 40)
        s.add(pr)
        s.flush()
        s.add(Evaluation(pull_request_id=pr.id, head_sha=pr.head_sha, base_sha=pr.base_sha, base_ref="main",
                         state=EvalState.DONE, trigger=Trigger.AUTO, profile=profile, verdict=verdict,
                         best_speedup=speedup, result=result))
    s.flush()
    return repo


def test_production_round_counts_only_gpu_profiles(settings):
    """A CPU `quick` tier (tiny model, shared core) never merges in production; elsewhere it may (demo)."""
    from bot.rounds import candidates

    with session_scope() as s:
        repo = _finished(s, 99, "o/gpu", [(1, "quick", "M", 0.60, None), (2, "standard", "M", 0.10, None),
                                           (3, "full", "M", 0.05, None)])
        assert [pr.number for pr, _ in candidates(s, repo, production=True)] == [2, 3]
        assert [pr.number for pr, _ in candidates(s, repo, production=False)] == [1, 2, 3]


def test_only_a_tier_made_in_the_full_sandbox_is_a_candidate(settings):
    """A verdict made under the sandbox development override, or one that is not a tier (mixed, uncalibrated,
    withheld, none), never enters a round, however large its measured speedup."""
    from bot.rounds import candidates

    rows = [(1, "L", 0.20, {}), (2, "XL", 0.90, {"sandbox_override": True}), (3, "mixed", 0.50, {}),
            (4, "uncalibrated", 0.50, {}), (5, "withheld", 0.50, {}), (6, "none", 0.50, {})]
    with session_scope() as s:
        repo = _finished(s, 98, "o/override", [(n, "standard", v, x, r) for n, v, x, r in rows])
        assert [pr.number for pr, _ in candidates(s, repo, production=True)] == [1]


def test_a_winner_github_refuses_to_merge_does_not_stall_every_round(settings, celery_worker, github, remote, send):
    """A conflict, a required review or a draft makes GitHub answer 405: the round merges the next best
    instead of raising (which left the round open and retried the same refused merge every few minutes)."""
    open_three(github, remote, send)
    repo = github.repos["codertocat/hello-world"]
    repo.pulls[3].mergeable = False
    plan = close(dry_run=False)
    assert plan.winner == 2 and repo.pulls[2].merged and not repo.pulls[3].merged
    steps = [(s.pr, s.action, s.reason) for s in plan.steps]
    assert steps[0][:2] == (3, "skip") and "refused the merge" in steps[0][2] and steps[1][:2] == (2, "merge")
    with session_scope() as s:
        assert [r.state for r in s.scalars(select(Round).order_by(Round.id))] == [RoundState.CLOSED, RoundState.OPEN]
    # #3 is re-evaluated against the new main (waited for: the next test's TRUNCATE must not meet it).
    wait_until(lambda: len(evaluations()) == 4 and not evaluations()[-1].state.active, what="re-evaluation of #3")


def test_only_a_speedup_measured_against_the_branch_it_merges_into_wins(settings, celery_worker, github, remote,
                                                                        send):
    """#3 was measured against main, then retargeted to `release` (its `edited` event not yet handled); #4 was
    measured against `release` (any branch will do as a slow base). Neither speedup says anything about what
    merging it does to main, so #2 (+45 % against main, still targeting it) wins."""
    from bot.testing.github_server import PullState
    repo = github.repos["codertocat/hello-world"]
    remote.git("branch", "release")
    repo.pulls[4] = PullState(number=4, title="PR 4", author="Codertocat", head_ref="d", base_ref="release")
    for number, branch, message in ((2, "a", "fast (xl:45)"), (3, "b", "faster (xl:60)"), (4, "d", "fastest (xl:90)")):
        remote.commit(branch, message)
        send("pull_request", pr_payload(github, remote, "opened", number=number, head_ref=branch))
        wait_until(finished(number - 1), what=f"evaluation of #{number}")
    repo.pulls[3].base_ref = "release"
    plan = close(dry_run=False)
    assert plan.winner == 2 and repo.pulls[2].merged and not (repo.pulls[3].merged or repo.pulls[4].merged)
    steps = [(s.pr, s.action, s.reason) for s in plan.steps]
    assert 4 not in [pr for pr, _, _ in steps]  # never a contender
    assert steps[0][:2] == (3, "skip") and "retargeted" in steps[0][2] and [s[:2] for s in steps[1:]] == [(2, "merge")]
    assert not any("moved" in c["body"] for c in github.comments_on(repo, 3))  # main is not its base any more


def test_a_tier_measured_after_an_infra_attempt_is_not_a_candidate(settings):
    """The bot re-dispatched #2's evaluation after an INFRA attempt. The worker should call its tier withheld;
    one that does not (an older worker, the fake's `flaky`) must still not get it merged: the bot counts the
    attempts itself. A clean evaluation (`/eval rerun`: attempt 1 again) may win."""
    from bot.db.models import Evaluation
    from bot.rounds import candidates

    with session_scope() as s:
        repo = _finished(s, 97, "o/retried", [(1, "standard", "L", 0.20, {}), (2, "standard", "XL", 0.90, {})])
        s.scalar(select(Evaluation).where(Evaluation.verdict == "XL")).attempt = 2
        assert [pr.number for pr, _ in candidates(s, repo, production=True)] == [1]


def test_claiming_a_round_works_on_sqlite(tmp_path):
    """The embedded default has no row locks (FOR UPDATE SKIP LOCKED is left out; SQLite serialises writers):
    a round is still claimed while open, and not once closed."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from bot.db.models import Base
    from bot.rounds import claim_round, open_round

    engine = create_engine(f"sqlite:///{tmp_path / 'rounds.sqlite3'}")
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        repo = Repository(id=1, full_name="o/r")
        s.add(repo)
        rnd = open_round(s, repo, window_s=60)
        assert claim_round(s, repo, rnd.id) is rnd and claim_round(s, repo) is rnd
        rnd.state = RoundState.CLOSED
        assert claim_round(s, repo, rnd.id) is None and claim_round(s, repo) is None
    engine.dispose()
