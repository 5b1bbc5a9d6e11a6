"""Red team of merge-first rounds (bot/rounds.py): what a round may merge, attacked with the real PostgreSQL,
Redis, the test GitHub server and real git remotes. Each test states the attack and the rule it checks; those of
sections 1, 2 and 4 and the last two failed before their fixes (session 19)."""
from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from bot.db.engine import session_scope
from bot.db.models import MainMeasurement, PullRequest, Round, utcnow
from bot.enums import EvalState, RoundState
from tests.bot.conftest import comment_payload, pr_payload, wait_until
from tests.bot.helpers import evaluations, finished, processed, two_measured_prs_and_a_due_round
from tests.bot.test_rounds import close

pytestmark = pytest.mark.services

REPO = "codertocat/hello-world"


def due() -> None:
    with session_scope() as s:
        s.execute(update(Round).where(Round.state == RoundState.OPEN).values(closes_at=utcnow()))


def beat() -> list[str]:
    from bot.queue.tasks import close_due_rounds
    return close_due_rounds()


def settle() -> None:
    wait_until(lambda: all(not e.state.active for e in evaluations()), timeout=30, what="every evaluation finished")


def pr_id(number: int) -> int:
    with session_scope() as s:
        return s.scalar(select(PullRequest.id).where(PullRequest.number == number))


def is_ancestor(remote, older: str, newer: str) -> bool:
    return subprocess.run(["git", "-C", str(remote.path), "merge-base", "--is-ancestor", older, newer]).returncode == 0


_clock = [datetime(2030, 1, 1, tzinfo=timezone.utc)]


def later() -> str:
    """A strictly increasing GitHub updated_at (real events of one PR carry increasing ones)."""
    _clock[0] += timedelta(seconds=5)
    return _clock[0].strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- 1. any INFRA attempt for the head in its history -------------------------------------------------------

def test_a_verdict_followed_by_an_infra_rerun_of_the_same_head_is_not_merged(settings, celery_worker, github, remote,
                                                                             send, monkeypatch):
    """#2's head is measured XL (attempt 1). A maintainer asks `/eval rerun` on the same head; that evaluation fails
    INFRA on every attempt (state INFRA, check `action_required`). The head now has INFRA attempts in its history and
    its newest verdict is INFRA: it must not be merged on the strength of the older XL (rounds.infra_since)."""
    from bot.testing import fake_evaluation
    head = remote.commit("a", "fast (xl:45)")
    send("pull_request", pr_payload(github, remote, "opened", number=2, head_ref="a"))
    wait_until(finished(1), what="the first evaluation")
    real = fake_evaluation._message
    monkeypatch.setattr(fake_evaluation, "_message", lambda url, sha: "infra" if sha == head else real(url, sha))
    d = send("issue_comment", comment_payload(github, 2, "/eval rerun", "maintainer")).json()["delivery"]
    wait_until(lambda: processed(d), what="/eval rerun handled")
    wait_until(lambda: len(evaluations()) == 2 and not evaluations()[-1].state.active, what="the rerun")
    evs = evaluations()
    assert [(e.head_sha, e.state) for e in evs] == [(head, EvalState.DONE), (head, EvalState.INFRA)]
    assert evs[-1].attempt == settings.eval.retries + 1  # every attempt of the rerun was INFRA
    due()
    (plan,) = beat()
    assert github.requests_for("pulls/merge") == [], plan
    assert not github.repos[REPO].pulls[2].merged


# ---- 2. a PR GitHub shows closed ----------------------------------------------------------------------------

def test_a_pr_closed_on_github_is_neither_told_main_moved_nor_re_evaluated(settings, celery_worker, github, remote,
                                                                            send):
    """#3 (+60 %) is closed by its author just before the round closes; its `closed` delivery is late (or lost:
    GitHub does not retry a failed delivery). The round reads #3 live, sees it closed and skips it ("no longer
    open"), merges #2 -- and then still comments "main moved ... will be re-evaluated" on the closed #3 and queues a
    GPU evaluation of it. A PR GitHub shows closed is stored closed and told nothing (rounds.mark_closed)."""
    two_measured_prs_and_a_due_round(github, remote, send)
    repo = github.repos[REPO]
    repo.pulls[3].state = "closed"  # closed on GitHub (not merged); the webhook not handled yet
    before = len(evaluations())
    (plan,) = beat()
    assert plan.splitlines()[-1].strip() == "winner: #2", plan
    assert "#3: skip — no longer open" in plan, plan
    settle()
    three = pr_id(3)
    told = sum("moved" in c["body"] for c in github.comments_on(repo, 3))
    evaluated = [e.pull_request_id for e in evaluations()[before:]].count(three)
    assert (told, evaluated) == (0, 0), f"closed #3 told main moved {told}x, evaluated {evaluated}x:\n{plan}"


# ---- 3. the merged tree is what was measured: tests/worker/test_checkout.py (the worker merges a head that lacks
# its base with it before measuring; a round merges only while the base is where it was measured) -----------------

# ---- 4. a merge GitHub made whose every answer was lost --------------------------------------------------------

@pytest.mark.parametrize("then", ["answers", "down"])
def test_a_merge_whose_every_answer_was_lost_is_still_the_rounds_winner(settings, celery_worker, github, remote,
                                                                        send, monkeypatch, then):
    """GitHub merges #3, then the answer to the PUT and to both of the client's retries is lost (connection reset;
    a short GitHub outage). The beat failed and rolled back; the next beat found #3 closed ("no longer open") and
    closed the round with no winner: #3's merge never recorded, #2 never told why main moved. A merge at the measured
    head onto the measured base is the round's winner whether or not its answer arrived: asked at once whether it
    merged (`answers`), or, when GitHub cannot say (`down`), read by the next beat (rounds.landed)."""
    from bot import rounds
    two_measured_prs_and_a_due_round(github, remote, send)
    github.resets = 10  # every write is applied, its answer lost
    with monkeypatch.context() as asked:
        if then == "down":
            asked.setattr(rounds, "merged_at", lambda *a: (_ for _ in ()).throw(ConnectionError("GitHub down")))
        beat()
    github.resets = 0
    assert github.repos[REPO].pulls[3].merged  # GitHub did merge it
    beat()  # the next beat, if the first closed nothing
    settle()
    assert round_winners()[0] == (RoundState.CLOSED, pr_id(3))


def round_winners() -> list:
    with session_scope() as s:
        return [(r.state, r.winner_pull_request_id) for r in s.scalars(select(Round).order_by(Round.id))]


# ---- 5. ties: candidates() sorts by (speedup, PR number); no test here, since PostgreSQL returned the rows in one
# order in every attempt (an UPDATE of the leader did not move it), so a tie test could not fail ---------------

# ---- 6. held (expected to pass) -------------------------------------------------------------------------------

def test_force_pushing_an_evaluated_head_back_after_a_reject_does_not_merge_the_reject(settings, celery_worker, github,
                                                                                      remote, send):
    """H1 is measured XL, H2 (pushed on top) REJECT, then the author force-pushes H1 back. Nothing may merge H2's
    verdict; if H1 merges, it is at H1 with H1's own verdict against the current main."""
    repo = github.repos[REPO]
    h1 = remote.commit("a", "fast (xl:45)")
    from bot.testing.github_server import PullState
    repo.pulls[2] = PullState(number=2, title="PR 2", author="Codertocat", head_ref="a", base_ref="main",
                              updated_at=later())
    send("pull_request", pr_payload(github, remote, "opened", number=2, head_ref="a"))
    wait_until(finished(1), what="H1")
    h2 = remote.commit("a", "slow")
    repo.pulls[2].updated_at = later()
    d = send("pull_request", pr_payload(github, remote, "synchronize", number=2, head_ref="a")).json()["delivery"]
    wait_until(lambda: processed(d), what="push H2")
    wait_until(finished(2), what="H2")
    remote.git("branch", "-f", "a", h1)  # force-push H1 back
    repo.pulls[2].updated_at = later()
    d = send("pull_request", pr_payload(github, remote, "synchronize", number=2, head_ref="a")).json()["delivery"]
    wait_until(lambda: processed(d), what="force-push H1")
    settle()
    due()
    (plan,) = beat()
    for m in github.requests_for("pulls/merge"):
        assert m.body["sha"] == h1 != h2, plan
    settle()


def test_author_retargets_after_the_verdict_and_back_no_merge_on_the_other_base(settings, celery_worker, github,
                                                                                 remote, send):
    """Measured against main, then retargeted to `release` (handled): the round must not merge it (anywhere)."""
    repo = github.repos[REPO]
    remote.git("branch", "release")
    remote.commit("a", "fast (xl:45)")
    from bot.testing.github_server import PullState
    repo.pulls[2] = PullState(number=2, title="PR 2", author="Codertocat", head_ref="a", base_ref="main",
                              updated_at=later())
    send("pull_request", pr_payload(github, remote, "opened", number=2, head_ref="a"))
    wait_until(finished(1), what="measured against main")
    repo.pulls[2].base_ref, repo.pulls[2].updated_at = "release", later()
    edited = pr_payload(github, remote, "opened", number=2, head_ref="a")
    edited["action"], edited["changes"] = "edited", {"base": {"ref": {"from": "main"}, "sha": {"from": "x"}}}
    d = send("pull_request", edited).json()["delivery"]
    wait_until(lambda: processed(d), what="retarget handled")
    settle()
    due()
    (plan,) = beat()
    assert github.requests_for("pulls/merge") == [], plan


def test_a_replayed_delivery_after_the_round_merged_does_not_bring_the_merged_pr_back(settings, celery_worker,
                                                                                     github, remote, send):
    """#3's `opened` body (captured before the round) is replayed after the round merged #3, first under a new
    delivery id (the signature covers only the body), then under the same id. It must queue nothing, and must not
    make the merged #3 a contender again: the next round (#2 wins) must neither comment on nor re-evaluate #3, nor
    count #3's merge a second time."""
    import json
    two_measured_prs_and_a_due_round(github, remote, send)
    repo = github.repos[REPO]
    opened3 = pr_payload(github, remote, "opened", number=3, head_ref="b")
    (plan,) = beat()
    assert plan.splitlines()[-1].strip() == "winner: #3"
    settle()
    moved_before = sum("moved" in c["body"] for c in github.comments_on(repo, 3))
    d1 = send("pull_request", opened3).json()["delivery"]
    wait_until(lambda: processed(d1), what="replay handled")
    d2 = send("pull_request", json.loads(json.dumps(opened3)), delivery=d1).json()["delivery"]
    assert d2 == d1
    settle()
    three = pr_id(3)
    n = len(evaluations())
    assert not [e for e in evaluations() if e.pull_request_id == three and e.state.active]
    due()
    (plan2,) = beat()
    settle()
    assert plan2.splitlines()[-1].strip() == "winner: #2", plan2
    assert [e.pull_request_id for e in evaluations()[n:]].count(three) == 0, f"merged #3 evaluated again:\n{plan2}"
    assert sum("moved" in c["body"] for c in github.comments_on(repo, 3)) == moved_before, plan2


def test_a_retarget_between_the_rounds_checks_and_its_merge_is_not_a_main_winner(settings, celery_worker, github,
                                                                                 remote, send, monkeypatch):
    """Race (hostile author toggling the base): #3 is retargeted to `release` after the round read it live (base
    main) and before the merge PUT, which pins only the head. GitHub merges #3 into `release`; the round records it
    as main's winner, told #2 "main moved" and re-evaluated it against a `release` commit. The merge cannot be
    undone, but the round reads where it landed before calling it main's winner (rounds.landed)."""
    from bot.github import publish
    two_measured_prs_and_a_due_round(github, remote, send)
    repo = github.repos[REPO]
    remote.git("branch", "release")
    real = publish.checks_green

    def checks_then_retarget(gh, sha, **kw):
        out = real(gh, sha, **kw)
        repo.pulls[3].base_ref = "release"  # the author's retarget lands here
        return out
    monkeypatch.setattr(publish, "checks_green", checks_then_retarget)
    (plan,) = beat()
    monkeypatch.undo()
    settle()
    assert repo.pulls[3].merged and repo.pulls[3].base_ref == "release"
    assert not is_ancestor(remote, repo.pulls[3].merge_commit_sha, "main")  # merged into release, not main
    with session_scope() as s:
        first = s.scalar(select(Round).order_by(Round.id))
        winner = first.winner_pull_request_id
    assert winner != pr_id(3), f"#3 merged into release recorded as main's winner:\n{plan}"
    assert "#3: skip — merged, but not onto main" in plan, plan


def test_a_loser_closed_on_github_whose_close_was_never_delivered_is_neither_told_nor_re_evaluated(
        settings, celery_worker, github, remote, send):
    """#2 (+45 %) is closed on GitHub, its `closed` delivery lost; #3 (+60 %) wins. The round never visits #2 as a
    candidate (it stops at the winner), so only a live read before the notice can see it closed."""
    two_measured_prs_and_a_due_round(github, remote, send)
    repo = github.repos[REPO]
    repo.pulls[2].state = "closed"
    before = len(evaluations())
    (plan,) = beat()
    assert plan.splitlines()[-1].strip() == "winner: #3", plan
    settle()
    told = sum("moved" in c["body"] for c in github.comments_on(repo, 2))
    evaluated = [e.pull_request_id for e in evaluations()[before:]].count(pr_id(2))
    assert (told, evaluated) == (0, 0), f"closed #2 told main moved {told}x, evaluated {evaluated}x:\n{plan}"
    with session_scope() as s:
        assert not s.get(PullRequest, pr_id(2)).is_open


def merge_3_then_replay_its_opened(github, remote, send) -> None:
    """#2 and #3 measured, the round merges #3; then #3's `opened` body, captured before, comes again under a new
    delivery id."""
    two_measured_prs_and_a_due_round(github, remote, send)
    opened3 = pr_payload(github, remote, "opened", number=3, head_ref="b")
    (plan,) = beat()
    assert plan.splitlines()[-1].strip() == "winner: #3", plan
    settle()
    d = send("pull_request", opened3).json()["delivery"]
    wait_until(lambda: processed(d), what="replay handled")


def test_an_older_payload_replayed_after_the_round_merged_cannot_reopen_the_winner(settings, celery_worker, github,
                                                                                   remote, send):
    """#3's `opened` body, captured before the round (its updated_at older than the merge), is replayed under a new
    delivery id after the round merged #3: the stored row stays closed."""
    merge_3_then_replay_its_opened(github, remote, send)
    with session_scope() as s:
        assert not s.get(PullRequest, pr_id(3)).is_open


def test_a_merge_is_counted_once_even_when_a_payload_reopens_its_row(settings, celery_worker, github, remote, send):
    """GitHub's clock ahead of ours: #3's payloads carry an updated_at later than the round's merge, so a replay of
    its `opened` body is not stale and reopens the stored row. The next round must still not count #3's merge
    again (a closed round already has it as its winner)."""
    repo = github.repos[REPO]
    from bot.testing.github_server import PullState
    repo.pulls[3] = PullState(number=3, title="PR 3", author="Codertocat", head_ref="b", base_ref="main",
                              updated_at="2099-01-01T00:00:00Z")
    merge_3_then_replay_its_opened(github, remote, send)
    settle()
    due()
    (plan2,) = beat()
    settle()
    wins = [winner for _, winner in round_winners()]
    assert wins.count(pr_id(3)) == 1, f"#3's merge counted {wins.count(pr_id(3))}x:\n{plan2}"


@pytest.mark.parametrize("payload_time", ["the merge's", "older than the stored row's"])
def test_the_closed_webhook_of_the_rounds_own_merge_measures_main(settings, celery_worker, github, remote, send,
                                                                   monkeypatch, tmp_path, payload_time):
    """The round merges #3, then GitHub's `closed` webhook for that merge arrives. It is handled, not ignored as
    older than what the round stored: main's history measures the merge commit. (The round had stored its own
    clock, later than GitHub's merge time, and every round winner was left out of main's history.) A merge is
    final, so even a `closed` payload older than the stored row (the row touched since) is handled."""
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path / "cache"))
    two_measured_prs_and_a_due_round(github, remote, send)
    (plan,) = beat()
    assert plan.splitlines()[-1].strip() == "winner: #3", plan
    settle()
    repo = github.repos[REPO]
    if payload_time != "the merge's":
        repo.pulls[3].updated_at = "2001-01-01T00:00:00Z"
    d = send("pull_request", pr_payload(github, remote, "closed", number=3, head_ref="b")).json()["delivery"]
    wait_until(lambda: processed(d), what="the merge's closed webhook")
    assert "older than the stored" not in processed(d).outcome, processed(d).outcome
    def measured():  # and finished: a measurement still running after this test would outlive its settings
        with session_scope() as s:
            rows = list(s.scalars(select(MainMeasurement)))
            return rows and all(m.state in ("done", "failed") for m in rows) and [(m.kind, m.sha) for m in rows]
    rows = wait_until(measured, timeout=30, what="main's measurement of the merge")
    assert ("merge", repo.pulls[3].merge_commit_sha) in rows, (processed(d).outcome, rows)


def test_a_head_measured_merged_with_its_base_is_not_rebase_merged(settings, celery_worker, github, remote, send):
    """With merge_method = rebase, GitHub replays the PR's commits on main one by one: a head that lacks its base
    was measured merged with it (worker/checkout.py), and the replay can land other code (a commit the PR undoes
    later undoes main's change too). Such a head is not merged until it is rebased."""
    from bot.settings import override_settings
    override_settings(settings.model_copy(update={"merge_method": "rebase"}))
    remote.commit("a", "fast (xl:45)")
    remote.commit("main", "main moves on after #2 branched off")
    send("pull_request", pr_payload(github, remote, "opened", number=2, head_ref="a"))
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="the evaluation")
    due()
    (plan,) = beat()
    assert github.requests_for("pulls/merge") == [], plan
    assert "a rebase-merge would not land as measured" in plan, plan
