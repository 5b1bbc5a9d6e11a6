"""Merge-first rounds: at the end of a window, merge the PR with the biggest verified speedup.

A winner must be non-REJECT with a positive tier, its head unchanged since the evaluation, its
base unchanged since then (otherwise it is re-evaluated against the fresh base first and waits
for the next round), and every other required check green. The worker measured the head as it
would land on that base (worker/checkout.py), so what merges is what was measured; where it
landed is read after the merge (`landed`), and a merge whose answer never arrived is found by
the next beat the same way. Dry-run returns the same plan without writing anything.

Closing is exclusive per round: the closer holds the round's row lock (FOR UPDATE SKIP LOCKED) from before it
reads its candidates until the round is written, and another closer (a second beat, the CLI) skips the round.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta, timezone

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from bot import render

from bot.github import publish
from bot.enums import MERGE_FIRST_LABEL, EvalState, RoundAction, RoundState, Trigger
from bot.db.models import Evaluation, PullRequest, Repository, Round, aware, utcnow
from bot.service import Service
from worker.config import MERGEABLE_PROFILES
from worker.records import TIERS, Verdict

log = logging.getLogger(__name__)

WINNING = {v.value for v in TIERS}  # mixed / uncalibrated / withheld / none are never merged


@dataclass
class Step:
    pr: int
    action: RoundAction
    reason: str
    head_moved: bool = False  # re-evaluated by its own push event, not by the round
    retargeted: bool = False  # its base is no longer the branch the round merged into


@dataclass
class RoundPlan:
    repo: str
    dry_run: bool
    steps: list[Step] = field(default_factory=list)
    winner: int | None = None

    def lines(self) -> list[str]:
        head = f"round for {self.repo}{' (dry run: nothing changed)' if self.dry_run else ''}"
        body = [f"  #{s.pr}: {s.action.value} — {s.reason}" for s in self.steps] or ["  no candidates"]
        tail = [f"  winner: #{self.winner}" if self.winner else "  no winner this round"]
        return [head, *body, *tail]


def candidates(session: Session, repo: Repository, production: bool = False) -> list[tuple[PullRequest, Evaluation]]:
    """Open PRs whose latest finished evaluation is of their current head with a positive tier, best first.

    In production only a GPU profile's verdict counts: a CPU `quick` tier never merges."""
    out = []
    for pr in session.scalars(select(PullRequest).where(PullRequest.repository_id == repo.id,
                                                        PullRequest.is_open.is_(True))):
        ev = session.scalar(select(Evaluation).where(Evaluation.pull_request_id == pr.id,
                                                     Evaluation.state == EvalState.DONE)
                            .order_by(Evaluation.id.desc()).limit(1))
        # A verdict made under the sandbox development override is never merged (worker/sandbox/probe.py).
        if ev is not None and (ev.result or {}).get("sandbox_override"):
            continue
        # Retried after an INFRA attempt: no tier until a clean evaluation, whatever the worker reported.
        if ev is not None and ev.attempt > 1:
            continue
        # Nor after a later evaluation of the same head that ended INFRA or was retried (a rerun that never got a
        # clean measurement): the INFRA attempt is in the head's history, the older verdict no longer stands alone.
        if ev is not None and infra_since(session, pr, ev):
            continue
        # Measured against the branch rounds merge into: a speedup over another branch says nothing about main.
        if ev is not None and ev.head_sha == pr.head_sha and ev.verdict in WINNING and ev.best_speedup \
                and ev.base_ref == repo.default_branch and (not production or ev.profile in MERGEABLE_PROFILES):
            out.append((pr, ev))
    # Ties go to the lower PR number: which one wins never depends on the order the database returns rows in.
    return sorted(out, key=lambda item: (-item[1].best_speedup, item[0].number))


def infra_since(session: Session, pr: PullRequest, ev: Evaluation) -> bool:
    """Whether an evaluation of `ev`'s head asked for after `ev` ended INFRA or needed a retry."""
    return session.scalar(select(Evaluation.id).where(
        Evaluation.pull_request_id == pr.id, Evaluation.head_sha == ev.head_sha, Evaluation.id > ev.id,
        or_(Evaluation.state == EvalState.INFRA, Evaluation.attempt > 1)).limit(1)) is not None


def open_round(session: Session, repo: Repository, window_s: float) -> Round:
    rnd = session.scalar(select(Round).where(Round.repository_id == repo.id, Round.state == RoundState.OPEN))
    if rnd is None:
        now = utcnow()
        rnd = Round(repository_id=repo.id, opened_at=now, closes_at=now + timedelta(seconds=window_s))
        session.add(rnd)
        session.flush()
    return rnd


def claim_round(session: Session, repo: Repository, round_id: int | None = None) -> Round | None:
    """Lock the round to close (that one, else the repository's open round) while it is still open; None when
    another closer holds it or has closed it. The lock lasts until the session's next commit (SQLite takes no
    row lock: it serialises writers instead)."""
    query = select(Round).where(Round.repository_id == repo.id, Round.state == RoundState.OPEN)
    if round_id is not None:  # a beat's due round: never the next window, opened by whoever closed this one
        query = query.where(Round.id == round_id)
    return session.scalar(query.with_for_update(skip_locked=True).execution_options(populate_existing=True))


def close_round(session: Session, service: Service, repo: Repository, dry_run: bool,
                round_id: int | None = None) -> RoundPlan | None:
    """Close the round (`round_id`, else the repository's open one); None when another closer has it."""
    rnd = None
    if not dry_run:
        rnd = claim_round(session, repo, round_id)
        if rnd is None:
            log.info("%s: round being closed, or closed already, by another closer: skipped", repo.full_name)
            return None
    plan = RoundPlan(repo=repo.full_name, dry_run=dry_run)
    gh = service.gh_repo(repo)
    contenders = candidates(session, repo, production=service.settings.environment == "production")
    winner: tuple[PullRequest, Evaluation] | None = None
    requeue: list[tuple[PullRequest, Evaluation, str]] = []  # (PR, its evaluation, the base to measure it against)
    closed: set[int] = set()  # contenders GitHub shows closed: never told main moved, never evaluated again
    method = service.settings.merge_method
    for pr, ev in contenders:
        live = gh.get_pull(pr.number)
        if live.state != "open":
            # Merged at its measured head onto its measured base, with no answer this round saw (every answer of
            # an earlier beat's merge lost; or merged by hand): the merge GitHub made is this round's winner.
            if not (live.merged and live.head.sha == ev.head_sha and not won_before(session, pr)
                    and landed(gh, ev, live.merge_commit_sha, method)):
                closed.add(pr.id)
                if not dry_run:
                    mark_closed(pr, live)
                plan.steps.append(Step(pr.number, RoundAction.SKIP, "no longer open"))
                continue
            merged_sha = live.merge_commit_sha
            winner = (pr, ev)
            plan.winner = pr.number
            plan.steps.append(Step(pr.number, RoundAction.MERGE, f"merged at its measured head {ev.head_sha[:7]} "
                                   f"onto {ev.base_ref} at {ev.base_sha[:7]} ({ev.verdict}, "
                                   f"{render.pct(ev.best_speedup)}); the merge's answer was not seen"))
            break
        if live.head.sha != ev.head_sha:
            plan.steps.append(Step(pr.number, RoundAction.SKIP, f"head moved {ev.head_sha[:7]} → "
                                   f"{live.head.sha[:7]} since its evaluation", head_moved=True))
            continue
        if live.base.ref != ev.base_ref:  # retargeted (an `edited` event): it would merge where nothing measured it
            plan.steps.append(Step(pr.number, RoundAction.SKIP, f"retargeted {ev.base_ref} → {live.base.ref} "
                                   f"since its evaluation", retargeted=True))
            continue
        base_now = publish.branch_tip(gh, ev.base_ref)
        if base_now != ev.base_sha:
            plan.steps.append(Step(pr.number, RoundAction.REEVALUATE, f"{ev.base_ref} moved {ev.base_sha[:7]} → "
                                   f"{base_now[:7]}: re-evaluating against it first"))
            requeue.append((pr, ev, base_now))
            continue
        if method == "rebase" and gh.compare(ev.base_sha, ev.head_sha).behind_by:
            # Measured merged with its base (worker/checkout.py); a rebase-merge replays the PR's commits one by one
            # instead, which can land other code (a commit undone later in the PR undoes the base's change too).
            plan.steps.append(Step(pr.number, RoundAction.SKIP, f"measured merged with {ev.base_ref} at "
                                   f"{ev.base_sha[:7]}, which a rebase-merge would not land as measured: rebase it"))
            continue
        green, why = publish.checks_green(gh, ev.head_sha, ignore_check=service.settings.check_name)
        if not green:
            plan.steps.append(Step(pr.number, RoundAction.SKIP, f"required checks not green: {why}"))
            continue
        if not dry_run:
            title = render.render("merge_commit_title.txt.j2", title=pr.title, number=pr.number).strip()
            try:
                merged_sha = publish.merge(gh, pr.number, ev.head_sha, method, title)
            except publish.MergeRefused as exc:  # the next best may merge: one PR must not stall every round
                # Unless GitHub did merge it and lost the answer (the client's retried PUT then met a 405).
                merged_sha = merged_at(gh, pr.number, ev.head_sha)
                if merged_sha is None:
                    plan.steps.append(Step(pr.number, RoundAction.SKIP, f"GitHub refused the merge: {exc}"))
                    continue
            except Exception:  # every answer lost: GitHub may have merged it; if it cannot say, the beat retries
                merged_sha = merged_at(gh, pr.number, ev.head_sha)
                if merged_sha is None:
                    raise
            # Where it landed, read after the merge: retargeted between the checks above and the merge (the merge
            # pins only the head), it is another branch's merge, not this round's winner.
            if not landed(gh, ev, merged_sha, method):
                log.error("round %s: #%s merged as %s, not onto %s at %s", repo.full_name, pr.number, merged_sha,
                          ev.base_ref, ev.base_sha)
                closed.add(pr.id)
                mark_closed(pr, gh.get_pull(pr.number))
                plan.steps.append(Step(pr.number, RoundAction.SKIP, f"merged, but not onto {ev.base_ref} at "
                                       f"{ev.base_sha[:7]} (retargeted during the merge?): not this round's winner"))
                continue
        winner = (pr, ev)
        plan.winner = pr.number
        plan.steps.append(Step(pr.number, RoundAction.MERGE, f"biggest verified speedup "
                               f"{render.pct(ev.best_speedup)} ({ev.verdict}) at {ev.head_sha[:7]}"))
        break
    others = [(pr, ev) for pr, ev in contenders if pr.id not in closed and (winner is None or pr.id != winner[0].id)]
    if winner is not None:
        plan.steps += [Step(pr.number, RoundAction.NOTIFY, "main moved; re-evaluated against it")
                       for pr, _ in others
                       if not any(s.pr == pr.number and (s.action is RoundAction.REEVALUATE or s.retargeted)
                                  for s in plan.steps)]
    if dry_run:
        return plan

    rnd.state = RoundState.CLOSED
    rnd.closed_at = utcnow()
    rnd.outcome = "\n".join(plan.lines())
    open_round(session, repo, service.settings.round_window_s)  # the next window starts now
    if winner is not None:
        pr, ev = winner
        # Merged: stored as of GitHub's updated_at after the merge, so an older payload replayed later cannot make it
        # a contender again, while the `closed` webhook of this very merge (same updated_at) is still handled.
        try:
            mark_closed(pr, gh.get_pull(pr.number))
        except Exception:  # noqa: BLE001 - GitHub away: the round and its winner are stored first all the same
            log.warning("round: #%s not read after its merge", pr.number, exc_info=True)
            pr.is_open = False
        rnd.winner_pull_request_id = pr.id
        rnd.winner_speedup = ev.best_speedup
        # GitHub has merged: the round is stored closed with its winner before any other write. Rolled back by a
        # failure after the merge (GitHub, the database, a killed process), it stayed open without its winner, and
        # the next beat merged a second PR in it once one was measured against the new base.
        session.commit()
        result = render.run_view(ev, service.max_attempts).result
        scored = next((g for g in (result.gates if result else []) if g.scored), None)
        # Notices from here on are best effort: a failed one must not cost the losers their re-evaluations.
        notify(f"#{pr.number}'s label", publish.add_label, gh, pr.number, MERGE_FIRST_LABEL)
        notify(f"#{pr.number}'s winner comment", publish.reply, gh, pr.number, render.render(
            "merge_first_winner.md.j2", speedup=ev.best_speedup, gate=scored.gate if scored else None,
            verdict=Verdict(ev.verdict), head_sha=ev.head_sha, base_ref=ev.base_ref, base_sha=ev.base_sha))
        for other, other_ev in others:
            steps = [s for s in plan.steps if s.pr == other.number]
            if any(s.action is RoundAction.REEVALUATE or s.retargeted for s in steps):
                continue  # re-evaluated against the fresh base already (requeue), or no longer based on it
            if not still_open_live(gh, other):  # closed on GitHub, its `closed` delivery late or lost
                continue
            head_moved = any(s.head_moved for s in steps)
            notify(f"#{other.number}'s main-moved comment", publish.reply, gh, other.number, render.render(
                "main_moved.md.j2", base_ref=ev.base_ref, winner_number=pr.number, needs_rebase=False))
            if not head_moved:  # a moved head is re-evaluated by its own push event
                requeue.append((other, other_ev, merged_sha))
    # Only now: each re-evaluation's dispatch commits, which releases the round's lock. Queued any earlier, it left
    # the round open and unlocked, and another closer closed it again; from here on it finds the round closed.
    for pr, ev, base_sha in requeue:
        reevaluate(session, service, pr, ev, base_sha)
    return plan


def landed(gh, ev: Evaluation, merge_sha: str | None, method: str) -> bool:
    """Whether `merge_sha` is `ev`'s head merged onto exactly the base it was measured against, and on that branch:
    the branch contains it, and it is the commits `method` makes on top of `ev.base_sha` and nothing else."""
    if not merge_sha:
        return False
    tip = publish.branch_tip(gh, ev.base_ref)
    if gh.compare(merge_sha, tip).behind_by != 0:
        return False
    made = 1 if method == "squash" else gh.compare(ev.base_sha, ev.head_sha).ahead_by + (method == "merge")
    onto = gh.compare(ev.base_sha, merge_sha)
    return onto.behind_by == 0 and onto.ahead_by == made


def mark_closed(pr: PullRequest, live) -> None:
    """Store what GitHub showed: closed, as of its updated_at, so an older payload replayed later (a redelivery, or
    a body captured earlier under a new delivery id) is stale and cannot reopen the row. A PR closed unmerged keeps
    a newer event the row already holds (a `reopened` handled since GitHub was read); a merge is final."""
    updated = live.updated_at
    if updated is not None and updated.tzinfo is None:
        updated = updated.replace(tzinfo=timezone.utc)
    stored = aware(pr.head_updated_at)
    newer_stored = updated is not None and stored is not None and updated < stored
    if newer_stored and not live.merged:
        return
    pr.is_open = False
    if updated is not None and not newer_stored:
        pr.head_updated_at = updated


def won_before(session: Session, pr: PullRequest) -> bool:
    """Whether a closed round already has this PR as its winner (its merge is never counted twice)."""
    return session.scalar(select(Round.id).where(Round.winner_pull_request_id == pr.id).limit(1)) is not None


def still_open_live(gh, pr: PullRequest) -> bool:
    """A loser read live before it is told main moved: False (and stored) when GitHub shows it closed; True when it
    is open or GitHub cannot say (the re-evaluation then reads the stored state, still_at)."""
    try:
        live = gh.get_pull(pr.number)
    except Exception:  # noqa: BLE001 - GitHub down: the stored state decides
        log.warning("round: #%s not read live before its notice", pr.number, exc_info=True)
        return True
    if live.state != "open":
        mark_closed(pr, live)
        return False
    return True


def merged_at(gh, number: int, head_sha: str) -> str | None:
    """The merge commit of the PR if GitHub shows it merged at `head_sha`, else None."""
    live = gh.get_pull(number)
    return live.merge_commit_sha if live.merged and live.head.sha == head_sha else None


def notify(what: str, write, *args) -> None:
    """A GitHub write after the round's merge is stored: logged, not raised, when it fails."""
    try:
        write(*args)
    except Exception:  # noqa: BLE001 - GitHub down: the round and its merge stand
        log.warning("round: %s not written", what, exc_info=True)


def reevaluate(session: Session, service: Service, pr: PullRequest, ev: Evaluation, base_sha: str) -> None:
    """Queue the PR's evaluated head again, against `base_sha`, if it still is the open PR's head (still_at)."""
    if still_at(session, service, pr, ev):
        pr.base_sha = base_sha
        service.request_evaluation(session, pr, Trigger.ROUND)


def still_at(session: Session, service: Service, pr: PullRequest, ev: Evaluation) -> bool:
    """Lock the PR's row and read it again: still open at the evaluated head? A push or a close handled while
    the round ran (its candidates were read unlocked, and each re-evaluation's commit releases every lock)
    has already superseded or cancelled what the round would queue from its stale copy."""
    fresh = service.lock_pull(session, pr.id)
    return fresh.is_open and fresh.head_sha == ev.head_sha


def close_due_rounds(session: Session, service: Service) -> list[RoundPlan]:
    """The plans of the due rounds this beat closed (not those another closer has, or closed since listed).

    Each round is committed on its own, and one that fails (its repository removed from the installation, GitHub
    down for it) is logged and left for the next beat: in one transaction, such a round stopped every repository's
    listed after it, and rolled back those closed before it, whose winners GitHub had merged already."""
    due = [(r.id, r.repository_id) for r in session.scalars(
        select(Round).where(Round.state == RoundState.OPEN, Round.closes_at <= utcnow()).order_by(Round.id))]
    plans = []
    for round_id, repository_id in due:
        try:
            plan = close_round(session, service, session.get(Repository, repository_id), service.settings.dry_run,
                               round_id=round_id)
            session.commit()
        except Exception:  # noqa: BLE001 - logged; the next beat tries this round again
            session.rollback()
            log.exception("round %s: closing it failed (if it is still open, the next beat tries again)", round_id)
            continue
        if plan is not None:
            plans.append(plan)
    return plans


def close_round_cli(repo_full_name: str, dry_run: bool) -> int:
    from bot.db.engine import session_scope
    with session_scope() as session:
        repo = session.scalar(select(Repository).where(Repository.full_name == repo_full_name))
        if repo is None:
            print(f"tokengate: unknown repository {repo_full_name!r} (no webhook seen for it yet)")
            return 2
        plan = close_round(session, Service(), repo, dry_run=dry_run or Service().settings.dry_run)
        if dry_run:
            session.rollback()
    if plan is None:
        print(f"tokengate: no open round of {repo_full_name} to close (another process is closing it?)")
        return 1
    print("\n".join(plan.lines()))
    return 0
