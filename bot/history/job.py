"""The change-point job: after a main measurement lands, scan each gate's history, post a new change
once, and bisect it by measuring midpoints until one commit is named."""
from __future__ import annotations

import logging
from typing import Callable

from celery import Celery
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from bot.db.models import ChangePoint, HistoryPoint, MainMeasurement, Repository
from bot.history import commits, detect
from bot.history.measure import queue_measurement
from bot.render import render
from bot.settings import Settings

log = logging.getLogger(__name__)
GhRepo = Callable[[Repository], object]  # repository row → PyGithub Repository (lazy)


# main_position of a merge whose commit the last scan did not find on main's first-parent line (force-pushed away):
# left out of main's history, where None (landed since the last scan, not placed yet) is plotted last
OFF_MAIN = -1
NOT_OFF_MAIN = or_(MainMeasurement.main_position.is_(None), MainMeasurement.main_position != OFF_MAIN)
# Main's measurements where their commits stand on its first-parent line (as the last scan placed them), then the
# ones not placed yet in the order they were queued
MAIN_ORDER = (MainMeasurement.main_position.is_(None), MainMeasurement.main_position, MainMeasurement.id)


def series(session: Session, repo_id: int, model: str, gate: str) -> list[HistoryPoint]:
    """Main's measured points of one gate (bisection measurements are not history), in the order their commits
    stand on main's first-parent line as the last scan placed them (`place_on_main`; merges force-pushed off it left
    out); points not placed yet follow in the order their measurements were queued. Webhooks are handled out of
    order (a failed delivery retried): queue order alone put a slowdown on a later, innocent commit."""
    return list(session.scalars(
        select(HistoryPoint).join(MainMeasurement, HistoryPoint.measurement_id == MainMeasurement.id)
        .where(HistoryPoint.repository_id == repo_id, HistoryPoint.model == model, HistoryPoint.gate == gate,
               MainMeasurement.kind == "merge", MainMeasurement.state == "done", HistoryPoint.tok_s.is_not(None),
               NOT_OFF_MAIN)
        .order_by(*MAIN_ORDER)))


def place_on_main(session: Session, repo: Repository, line: dict[str, int]) -> None:
    """Store each merge measurement's position on main's first-parent `line` (sha → position; OFF_MAIN: off it)."""
    for m in session.scalars(select(MainMeasurement).where(MainMeasurement.repository_id == repo.id,
                                                           MainMeasurement.kind == "merge")):
        m.main_position = line.get(m.sha, OFF_MAIN)
    session.flush()


def machine_of(m: MainMeasurement) -> str:
    """What makes two measurements' absolute tok/s one series: the profile and the device model that measured
    them (a GPU pool changing its cards is no change on main)."""
    host = ((m.result or {}).get("receipt") or {}).get("host") or {}
    device = (host.get("gpu") or {}).get("name") or host.get("cpu_model") or "unknown device"
    return f"{m.profile} on {device}"


def by_machine(session: Session, points: list[HistoryPoint]) -> dict[str, list[HistoryPoint]]:
    """`points` split into one series per machine_of (its key), each in the given order."""
    ids = {p.measurement_id for p in points}
    machine = {m.id: machine_of(m) for m in session.scalars(select(MainMeasurement).where(MainMeasurement.id.in_(ids)))}
    groups: dict[str, list[HistoryPoint]] = {}
    for p in points:
        groups.setdefault(machine[p.measurement_id], []).append(p)
    return groups


def gates_of(session: Session, repo_id: int) -> list[tuple[str, str]]:
    rows = session.execute(select(HistoryPoint.model, HistoryPoint.gate).where(HistoryPoint.repository_id == repo_id)
                           .distinct().order_by(HistoryPoint.model, HistoryPoint.gate))
    def order(mg):  # decode@32 before decode@160: the context as a number
        kind, _, ctx = mg[1].partition("@")
        return mg[0], kind, int(ctx) if ctx.isdigit() else 0, mg[1]
    return sorted(((m, g) for m, g in rows), key=order)


def history_url(settings: Settings, repo: Repository, model: str, gate: str, cp_id: int | None = None) -> str | None:
    if not settings.public_base_url:
        return None
    base = settings.public_base_url.rstrip("/")
    return f"{base}/repos/{repo.full_name}/history?model={model}&gate={gate}" + (f"#cp-{cp_id}" if cp_id else "")


def scan(session: Session, settings: Settings, celery: Celery, gh_repo: GhRepo, repo: Repository) -> list[ChangePoint]:
    """Every gate's history → new change points (posted once, bisection queued)."""
    found = []
    try:
        line = commits.first_parent_line(repo.clone_url, repo.default_branch) if repo.clone_url else None
    except commits.GitError as exc:
        log.warning("%s: main's commit order not read (%s): the last order read, new measurements in queue order",
                    repo.full_name, exc)
        line = None
    if line is not None:
        place_on_main(session, repo, line)
    every_series = [(model, gate, points) for model, gate in gates_of(session, repo.id)
                    for points in by_machine(session, series(session, repo.id, model, gate)).values()]
    for model, gate, points in every_series:
        known = set(session.scalars(select(ChangePoint.sha).where(ChangePoint.repository_id == repo.id,
                                                                 ChangePoint.model == model,
                                                                 ChangePoint.gate == gate)))
        for change in detect.detect([p.tok_s for p in points], settings.changepoint_min_step):
            near = {p.sha for p in points[max(0, change.index - detect.MIN_SEGMENT):change.index + detect.MIN_SEGMENT]}
            if near & known:
                continue  # the same shift, located one commit over now that more points are in
            cp = ChangePoint(repository_id=repo.id, model=model, gate=gate, sha=points[change.index].sha,
                             previous_sha=points[change.index - 1].sha, rel_step=change.rel_step,
                             false_alarm_rate=detect.FALSE_ALARM_RATE, state="bisecting",
                             good_sha=points[change.index - 1].sha, bad_sha=points[change.index].sha)
            session.add(cp)
            session.flush()
            known.add(cp.sha)
            post(session, settings, gh_repo, repo, cp)
            advance(session, settings, celery, gh_repo, repo, cp)  # may commit (a task was sent): lock again
            repo = session.get(Repository, repo.id, with_for_update=True, populate_existing=True)
            found.append(cp)
    return found


def post(session: Session, settings: Settings, gh_repo: GhRepo, repo: Repository, cp: ChangePoint) -> None:
    """One post per change point: a comment on the merged PR that introduced it (an issue when no PR is
    known), edited in place as the bisection narrows the range."""
    intro = session.scalar(select(MainMeasurement).where(MainMeasurement.repository_id == repo.id,
                                                         MainMeasurement.kind == "merge",
                                                         MainMeasurement.sha == cp.sha))
    pr = intro.pull_request if intro is not None else None
    body = render("change_point.md.j2", cp=cp, repo=repo, pr=pr,
                  url=history_url(settings, repo, cp.model, cp.gate, cp.id))
    title = f"tokengate: {cp.model} {cp.gate} moved {cp.rel_step:+.1%} on {repo.default_branch}"
    gh = gh_repo(repo)
    if cp.comment_id is not None:
        gh.get_issue(cp.pull_request_number or cp.issue_number).get_comment(cp.comment_id).edit(body)
    elif cp.issue_number is not None:
        gh.get_issue(cp.issue_number).edit(body=body)
    elif pr is not None:
        cp.pull_request_number = pr.number
        cp.comment_id = gh.get_issue(pr.number).create_comment(body).id
    else:
        cp.issue_number = gh.create_issue(title=title, body=body).number


def update_post(session: Session, settings: Settings, gh_repo: GhRepo, repo: Repository, cp: ChangePoint) -> None:
    """The post edited as the bisection moves: best effort. Raised, GitHub's refusal rolled back the step's state
    (a measurement already taken, the next one not queued), and a retry of the result does not take the step
    again. A refused edit marks the post stale: the next step's edit, or the beat (`refresh_stale_posts`) when the
    bisection has ended, shows the state stored."""
    try:
        post(session, settings, gh_repo, repo, cp)
    except Exception:  # noqa: BLE001 - logged; the state is stored and a later edit shows it
        cp.post_stale = True
        log.warning("change point %s: its post not updated (%s)", cp.id, cp.state, exc_info=True)
    else:
        cp.post_stale = False


def refresh_stale_posts(session: Session, settings: Settings, gh_repo: GhRepo) -> list[str]:
    """Posts whose last edit GitHub refused, edited again (beat): a bisection that ended while GitHub was down
    has no next step to carry its outcome."""
    outcomes = []
    for cp_id in list(session.scalars(select(ChangePoint.id).where(ChangePoint.post_stale.is_(True)))):
        # A change point locked by its bisection step (minutes: a mirror fetch, GitHub's retries) is skipped: that
        # step edits the post, or the next beat does. Waited for, every beat held a publish thread behind it.
        cp = session.get(ChangePoint, cp_id, with_for_update={"skip_locked": True}, populate_existing=True)
        if cp is None or not cp.post_stale:
            continue  # edited meanwhile, or being stepped
        update_post(session, settings, gh_repo, cp.repository, cp)
        session.commit()  # each post on its own: one GitHub refuses does not undo another's edit
        outcomes.append(f"change point {cp_id}: post {'still stale' if cp.post_stale else 'updated'}")
    return outcomes


def advance(session: Session, settings: Settings, celery: Celery, gh_repo: GhRepo, repo: Repository,
            cp: ChangePoint) -> None:
    """Name the commit when one is left in (good, bad]; otherwise measure the midpoint against good."""
    try:
        between = commits.commits_between(repo.clone_url, cp.good_sha, cp.bad_sha)
    except commits.GitError as exc:
        cp.state, cp.detail = "unresolved", f"could not list commits: {exc}"
        update_post(session, settings, gh_repo, repo, cp)
        return
    if not between:  # the last candidate was measured against its parent and did not move: nothing is left
        cp.state = "unresolved"
        cp.detail = (f"no commit reproduces the {cp.rel_step:+.1%} step when measured against its parent: a false "
                     "alarm of the detector is possible")
        update_post(session, settings, gh_repo, repo, cp)
        return
    if len(between) == 1:
        # Named only on a paired measurement of the commit itself that shows the step: the range's bad end may
        # come from the detector alone (never measured), and a noise alarm must not become a public accusation of
        # whichever commit is left.
        culprit, rel = between[0], evidence(session, cp, between[0], cp.good_sha)
        if rel is None:
            queue_measurement(session, settings, celery, repo, kind="bisect", sha=culprit, base_sha=cp.good_sha,
                              change_point_id=cp.id)
        elif is_bad(rel, cp.rel_step):
            cp.state, cp.culprit_sha = "named", culprit
            update_post(session, settings, gh_repo, repo, cp)
        else:
            cp.state = "unresolved"
            cp.detail = (f"`{culprit[:12]}` measured against its parent `{cp.good_sha[:12]}` moved {rel:+.1%}, not "
                         f"the {cp.rel_step:+.1%} step, and no earlier commit reproduces it: a false alarm of the "
                         "detector is possible")
            update_post(session, settings, gh_repo, repo, cp)
        return
    mid = between[(len(between) - 1) // 2]
    queue_measurement(session, settings, celery, repo, kind="bisect", sha=mid, base_sha=cp.good_sha,
                      change_point_id=cp.id)


def evidence(session: Session, cp: ChangePoint, sha: str, good: str) -> float | None:
    """A paired measurement of `sha` on the change point's gate that can name it: one this bisection took (against
    an earlier good end: an ancestor of `good`) that showed the step, else the newest against `good` itself (a
    merge measured against its parent). Its relative change, or None when there is none."""
    def measured(*where) -> list[float]:
        return list(session.scalars(
            select(HistoryPoint.rel_change).join(MainMeasurement, HistoryPoint.measurement_id == MainMeasurement.id)
            .where(MainMeasurement.repository_id == cp.repository_id, MainMeasurement.sha == sha,
                   MainMeasurement.state == "done", HistoryPoint.model == cp.model, HistoryPoint.gate == cp.gate,
                   HistoryPoint.rel_change.is_not(None), *where)
            .order_by(MainMeasurement.id.desc())))
    shown = [r for r in measured(MainMeasurement.change_point_id == cp.id) if is_bad(r, cp.rel_step)]
    if shown:
        return shown[0]
    against_good = measured(MainMeasurement.base_sha == good)
    return against_good[0] if against_good else None


def is_bad(rel_change: float, rel_step: float) -> bool:
    """A midpoint has the change when its move from good is closer to the step than to no move."""
    return abs(rel_change - rel_step) < abs(rel_change)


def bisect_step(session: Session, settings: Settings, celery: Celery, gh_repo: GhRepo, m: MainMeasurement) -> str:
    cp = session.get(ChangePoint, m.change_point_id, with_for_update=True)
    repo = session.get(Repository, m.repository_id)
    if cp is None or cp.state != "bisecting":
        return f"bisection measurement {m.id}: change point no longer bisecting"
    point = next((p for p in m.points if p.model == cp.model and p.gate == cp.gate), None)
    if m.state != "done" or point is None or point.rel_change is None:
        cp.state = "unresolved"
        cp.detail = f"measuring {m.sha[:7]} failed: {m.detail or (point.reason if point else 'gate not measured')}"
        update_post(session, settings, gh_repo, repo, cp)
        return cp.detail
    bad = is_bad(point.rel_change, cp.rel_step)
    if bad:
        cp.bad_sha = m.sha
    else:
        cp.good_sha = m.sha
    advance(session, settings, celery, gh_repo, repo, cp)
    return f"change point {cp.id}: {m.sha[:7]} is {'bad' if bad else 'good'} ({point.rel_change:+.2%})"


def after_measurement(session: Session, settings: Settings, celery: Celery, gh_repo: GhRepo,
                      m: MainMeasurement) -> str:
    """What a landed main measurement sets off: a history scan (merges) or the next bisection step."""
    if m.kind == "bisect":
        return bisect_step(session, settings, celery, gh_repo, m)
    if m.state != "done":
        return f"main measurement {m.id} failed: {m.detail}"
    repo = session.get(Repository, m.repository_id, with_for_update=True)  # one scan per repository at a time
    found = scan(session, settings, celery, gh_repo, repo)
    return f"main measurement {m.id}: {len(found)} new change point(s)"


