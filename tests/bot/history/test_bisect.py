"""A planted step in main's history, end to end through the real queue: merges measured on the `gpu`
queue (a stand-in that reads tok/s from the tree), the change point found at the merge that brought
it, posted once on that PR, and bisected by queued midpoint measurements to the one commit."""
from __future__ import annotations

import pytest

from bot.db.engine import session_scope
from bot.db.models import ChangePoint, MainMeasurement, PullRequest
from bot.history import job, measure
from bot.settings import override_settings
from tests.bot.conftest import wait_until
from tests.bot.history import tree_fake
from tests.bot.web import fill

pytestmark = pytest.mark.services
CULPRIT = 26  # commit number that lowers speed.txt; main is measured after every third commit (15 merges:
# the detector first scans at 12)


def write_main(remote, n: int) -> list[str]:
    shas = []
    for i in range(1, n + 1):
        level = 370.0 if i >= CULPRIT else 400.0
        (remote.path / "speed.txt").write_text(f"{level * (1 + 0.004 * ((i * 7) % 5 - 2)):.2f}\n")
        remote.git("add", "-A")
        remote.git("commit", "-q", "-m", f"commit {i}")
        shas.append(remote.git("rev-parse", "HEAD"))
    return shas


def test_planted_step_is_posted_once_and_bisected_to_its_commit(settings, github, remote, celery_worker,
                                                                 monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "EVALUATE", tree_fake.TASK)
    override_settings(settings.model_copy(update={"public_base_url": "https://tg.example.org"}))
    (remote.path / "speed.txt").write_text("400\n")
    remote.git("add", "-A")
    remote.git("commit", "-q", "-m", "speed file")
    shas = write_main(remote, 45)
    from bot.queue.app import celery_app
    from bot.testing.github_server import PullState
    state = github.repos["codertocat/hello-world"]
    with session_scope() as session:
        repo = fill.repository(session, github, remote)
        repo_id = repo.id
    for k, i in enumerate(range(3, 46, 3)):  # a rebase-merged PR of three commits each
        state.pulls[100 + k] = PullState(number=100 + k, title=f"PR {100 + k}", author="dev", head_ref=f"b{k}",
                                         base_ref="main", state="closed", merged=True, merge_commit_sha=shas[i - 1])
        with session_scope() as session:
            repo = session.get(type(repo), repo_id)
            pr = PullRequest(repository_id=repo.id, number=100 + k, author_login="dev", head_sha=shas[i - 1],
                             head_ref=f"b{k}", base_ref="main", base_sha=shas[i - 4], is_open=False)
            session.add(pr)
            session.flush()
            measure.on_main_merged(session, settings, celery_app(), repo, pr, shas[i - 1])

    def named():
        with session_scope() as session:
            cps = session.query(ChangePoint).all()
            return cps and all(cp.state != "bisecting" for cp in cps) and [
                (cp.state, cp.culprit_sha, cp.sha, cp.previous_sha, cp.rel_step, cp.pull_request_number) for cp in cps]
    [(state_, culprit, sha, previous, step, pr_number)] = wait_until(named, timeout=60, what="the bisection")
    index = {s: i + 1 for i, s in enumerate(shas)}
    with session_scope() as session:
        trail = [(m.kind, index.get(m.sha), index.get(m.base_sha), m.state, m.detail) for m in
                 session.query(MainMeasurement).order_by(MainMeasurement.id)]
    assert (state_, index.get(culprit)) == ("named", CULPRIT), (trail[15:], index.get(sha), index.get(previous))
    assert (previous, sha) == (shas[23], shas[26])  # measured after commits 24 and 27
    assert step == pytest.approx(-0.075, abs=0.01)
    with session_scope() as session:
        bisect = session.query(MainMeasurement).filter_by(kind="bisect").order_by(MainMeasurement.id).all()
        assert [index[m.sha] for m in bisect] == [26, 25]  # (24, 27]: 26 is bad, then (24, 26]: 25 is good
    posts = [c for c in github.comments.values() if "moved" in c["body"]]
    assert len(posts) == 1 and posts[0]["issue"] == 108  # once, on the PR whose merge brought commit 27
    body = posts[0]["body"]
    assert f"Culprit: `{shas[CULPRIT - 1]}`" in body and posts[0]["edits"] >= 1
    assert "https://tg.example.org/repos/Codertocat/Hello-World/history?model=qwen35-tiny&gate=decode@512" in body


def test_a_flat_history_raises_nothing(settings, github, remote, monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path / "cache"))
    from bot.testing.fake_evaluation import result_for
    with session_scope() as session:
        repo = fill.repository(session, github, remote)
        for i, rel in enumerate([0.003, -0.004, 0.001, 0.0, 0.004, -0.002, 0.002, -0.003]):
            r = result_for("none", repo=repo.full_name, pr=None, base_sha=f"{i:040x}", head_sha=f"{i + 1:040x}")
            r.gates[0].head_median = 410.0 * (1 + rel)
            fill.main(session, repo, r)
        assert job.scan(session, settings, None, lambda _: pytest.fail("nothing to post"), repo) == []


def test_is_bad_is_closer_to_the_step():
    assert job.is_bad(-0.07, -0.075) and not job.is_bad(-0.01, -0.075) and job.is_bad(0.05, 0.06)


def test_a_result_for_other_revisions_is_not_history(settings, github, remote):
    """The worker's result cache is keyed without the base: an answer for another base must not be plotted."""
    from bot.testing.fake_evaluation import result_for
    with session_scope() as session:
        repo = fill.repository(session, github, remote)
        m = MainMeasurement(repository_id=repo.id, kind="merge", sha="b" * 40, base_sha="a" * 40, state="queued",
                            profile="quick", celery_task_id="t1")
        session.add(m)
        session.flush()
        other = result_for("none", repo=repo.full_name, pr=None, base_sha="c" * 40, head_sha="b" * 40).to_dict()
        assert measure.accept(session, m.id, "t0", other) == f"main measurement {m.id}: stale task t0 ignored"
        got = measure.accept(session, m.id, "t1", other)
        assert got.state == "failed" and "asked aaaaaaa..bbbbbbb, got ccccccc..bbbbbbb" in got.detail
        assert got.points == []
        assert measure.accept(session, m.id, "t1", other) == f"main measurement {m.id} is failed: ignored"


def test_the_same_shift_found_one_commit_over_is_not_posted_again(settings, github, remote):
    from bot.db.models import ChangePoint
    from bot.testing.fake_evaluation import result_for
    with session_scope() as session:
        repo = fill.repository(session, github, remote)
        shas = []
        for i, level in enumerate([400, 401, 399, 400, 400, 370, 371, 369, 370]):
            r = result_for("none", repo=repo.full_name, pr=None, base_sha=f"{i:040x}", head_sha=f"{i + 1:040x}")
            r.gates[0].head_median = float(level)
            shas.append(fill.main(session, repo, r).sha)
        # an earlier scan, with fewer points, had placed this shift one commit early
        session.add(ChangePoint(repository_id=repo.id, model="qwen35-tiny", gate="decode@512", sha=shas[4],
                                previous_sha=shas[3], rel_step=-0.07, false_alarm_rate=0.01, state="bisecting",
                                good_sha=shas[3], bad_sha=shas[4]))
        session.flush()
        assert job.scan(session, settings, None, lambda _: pytest.fail("posted twice"), repo) == []
        assert session.query(ChangePoint).count() == 1
