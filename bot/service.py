"""What the bot does, independent of how it was asked: queue, supersede, cancel, publish.

Every method runs inside one database session on the `publish` side (the only side with
GitHub and database credentials). GitHub writes happen while the pull request's row is
locked, so two publish tasks for one PR never race on its comment or labels.
"""
from __future__ import annotations

import hmac
import logging
import time
import uuid
from datetime import datetime, timezone

from celery import Celery, signature
from sqlalchemy import inspect, select, update
from sqlalchemy.orm import Session, make_transient_to_detached

from bot import render

from bot.github import publish
from bot.enums import TRANSITIONS, CheckConclusion, EvalState, InfraReason, Trigger
from bot.github.client import GitHubApp, get_github_app
from bot.github.labels import labels_for
from bot.db.models import (Evaluation, GateResultRow, GuardResultRow, Installation, PullRequest, Receipt, Repository,
                           aware, utcnow)
from bot.queue.outbox import HANDLING_DELIVERY
from bot.queue.position import queue_info
from bot.queue.watchdog import RECHECK_S, TaskProbe
from bot.settings import Settings, get_settings
from worker.queue.app import EVALUATE_TASK, GPU_QUEUE, PUBLISH_QUEUE
from worker.records import EvalResult, InfraKind, Verdict

log = logging.getLogger(__name__)

RESULT_TASK = "tokengate.publish_result"
HEAD_HISTORY = 20  # heads remembered per PR (which one a maintainer's /eval refers to)
FAILURE_TASK = "tokengate.evaluation_failed"
EARLIER_RUNS_SHOWN = 10


_KEYS = {Installation: ("id",), Repository: ("id",), PullRequest: ("repository_id", "number")}


def login_of(user) -> str:
    """A user object's login; GitHub sends `null` for deleted accounts ("ghost")."""
    return str((user or {}).get("login") or "ghost") if isinstance(user, dict) or user is None else "ghost"


def parse_time(value) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return aware(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        return None


def iso(t: datetime) -> str:
    return aware(t).isoformat()


class NoInstallation(ValueError):
    """An event for a repository we are not installed on: nothing to do, nothing to retry."""


class InvalidTransition(RuntimeError):
    pass


def transition(ev: Evaluation, new: EvalState) -> None:
    if new not in TRANSITIONS[ev.state]:
        raise InvalidTransition(f"evaluation {ev.id}: {ev.state.value} → {new.value} is not allowed")
    ev.state = new


def withdraw_check(repo, check_run_id: int) -> None:
    """Complete a check run no evaluation refers to (best effort: the caller is already failing for its own
    reason, which is the one to raise)."""
    try:
        publish.complete_check(repo, check_run_id, CheckConclusion.CANCELLED.value, render.unrecorded_check_output())
    except Exception:  # noqa: BLE001 - logged; GitHub is down as well
        log.warning("check run %s: left queued, its evaluation was not stored", check_run_id, exc_info=True)


def attempt_stored(session: Session, eval_id: int, attempt: str | None) -> bool:
    """Whether evaluation `eval_id`'s attempt `attempt` (its task id) is in the database, read on a connection of
    its own; a database still away answers False: the caller raises, and the delivery's retry finds the attempt
    stored but never sent (Service._own_attempt_never_sent)."""
    try:
        with Session(bind=session.get_bind()) as probe:
            return attempt is not None and probe.scalar(
                select(Evaluation.celery_task_id).where(Evaluation.id == eval_id)) == attempt
    except Exception:  # noqa: BLE001 - logged by the caller's raise
        return False


class Service:
    def __init__(self, settings: Settings | None = None, github: GitHubApp | None = None,
                 celery: Celery | None = None):
        self.settings = settings or get_settings()
        self._github = github
        self._celery = celery

    @property
    def github(self) -> GitHubApp:
        if self._github is None:
            self._github = get_github_app()
        return self._github

    @property
    def celery(self) -> Celery:
        if self._celery is None:
            from bot.queue.app import celery_app
            self._celery = celery_app()
        return self._celery

    @property
    def max_attempts(self) -> int:
        return self.settings.eval.retries + 1

    # ---- GitHub handles -------------------------------------------------------------------------
    def gh_repo(self, repo: Repository):
        if repo.installation_id is None:
            raise NoInstallation(f"{repo.full_name}: no installation on record, cannot authenticate")
        return self.github.client(repo.installation_id).get_repo(repo.full_name)  # lazy: no request

    def is_trusted(self, repo: Repository, login: str) -> bool:
        return self.github.is_trusted(repo.installation_id, repo.full_name, login)

    # ---- rows from payloads ---------------------------------------------------------------------
    @staticmethod
    def _ensure_row(session: Session, model, **key) -> None:
        """INSERT … ON CONFLICT DO NOTHING: concurrent deliveries for one repository/PR never collide."""
        dialect = session.get_bind().dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:  # pragma: no cover - other databases: plain insert when missing
            if session.scalar(select(model).filter_by(**{k: v for k, v in key.items() if k in _KEYS[model]})) is None:
                session.add(model(**key))
                session.flush()
            return
        session.execute(insert(model).values(**key).on_conflict_do_nothing())

    def upsert_installation(self, session: Session, payload: dict) -> Installation:
        login = (payload.get("account") or {}).get("login", "")
        self._ensure_row(session, Installation, id=payload["id"], account_login=login, created_at=utcnow())
        inst = session.get(Installation, payload["id"], with_for_update=True, populate_existing=True)
        inst.account_login = login or inst.account_login
        inst.deleted_at = None
        return inst

    def upsert_repository(self, session: Session, payload: dict, installation_id: int | None) -> Repository:
        """By GitHub's id: a name now held by another id (renamed, deleted and re-created) is freed first."""
        repo_id, full_name = int(payload["id"]), str(payload.get("full_name") or payload.get("name") or "")
        if installation_id is not None:
            self._ensure_row(session, Installation, id=installation_id,
                             account_login=login_of(payload.get("owner")), created_at=utcnow())
        session.execute(update(Repository).where(Repository.full_name == full_name, Repository.id != repo_id)
                        .values(full_name=Repository.full_name + f" (gone: renamed or re-created, now id {repo_id})"))
        self._ensure_row(session, Repository, id=repo_id, full_name=full_name,
                         default_branch=payload.get("default_branch") or "main")
        repo = session.get(Repository, repo_id, with_for_update=True, populate_existing=True)
        repo.full_name = full_name
        repo.clone_url = payload.get("clone_url") or repo.clone_url
        repo.default_branch = payload.get("default_branch") or repo.default_branch or "main"
        if installation_id is not None:
            repo.installation_id = installation_id
        return repo

    def upsert_pull(self, session: Session, repo: Repository, pr: dict) -> PullRequest:
        """Store the PR as the payload shows it — unless the payload is older than what is stored: heads only
        move forward (by GitHub's updated_at; on a tie, by commit ancestry through the API)."""
        head, base = pr.get("head") or {}, pr.get("base") or {}
        updated = parse_time(pr.get("updated_at"))
        self._ensure_row(session, PullRequest, repository_id=repo.id, number=pr["number"],
                         author_login=login_of(pr.get("user")), head_sha=head["sha"], head_ref=head.get("ref") or "",
                         base_ref=base.get("ref") or "", base_sha=base.get("sha") or "", title="", is_open=True,
                         awaiting_approval=False, updated_at=utcnow(), head_updated_at=updated,
                         head_history=[[head["sha"], iso(updated or utcnow())]])
        row = session.scalar(select(PullRequest).where(PullRequest.repository_id == repo.id,
                                                       PullRequest.number == pr["number"])
                             .with_for_update().execution_options(populate_existing=True))
        if self.is_stale(repo, row, head["sha"], updated):
            session.info.setdefault("stale_pulls", set()).add(row.id)
            return row
        if head["sha"] != row.head_sha:
            history = [h for h in (row.head_history or []) if h[0] != head["sha"]]
            row.head_history = (history + [[head["sha"], iso(updated or utcnow())]])[-HEAD_HISTORY:]
        if updated is not None and (row.head_updated_at is None or updated > aware(row.head_updated_at)):
            row.head_updated_at = updated
        row.title = pr.get("title") or ""
        row.html_url = pr.get("html_url")
        row.author_login = login_of(pr.get("user"))
        row.head_sha = head["sha"]
        row.head_ref = head.get("ref") or row.head_ref
        row.head_clone_url = ((head.get("repo") or {}).get("clone_url"))
        row.base_ref = base.get("ref") or row.base_ref
        row.base_sha = base.get("sha") or row.base_sha
        row.is_open = pr.get("state", "open") == "open"
        session.flush()
        return row

    def is_stale(self, repo: Repository, row: PullRequest, sha: str, updated: datetime | None) -> bool:
        """True when the payload's head is older than the stored one (never when it is the same commit)."""
        stored = aware(row.head_updated_at)
        if stored is not None and updated is not None and updated != stored:
            return updated < stored
        if sha == row.head_sha:
            return False
        # Same updated_at (or none): the payload is old when its head is an ancestor of the stored head.
        status = self.gh_repo(repo).compare(sha, row.head_sha).status
        return status == "ahead"

    @staticmethod
    def lock_pull(session: Session, pr_id: int) -> PullRequest:
        return session.get(PullRequest, pr_id, with_for_update=True, populate_existing=True)

    # ---- evaluations ----------------------------------------------------------------------------
    def request_evaluation(self, session: Session, pr: PullRequest, trigger: Trigger,
                           requested_by: str | None = None) -> Evaluation | None:
        """Queue an evaluation of the PR's current head (older heads are superseded; no duplicates). Only an
        explicit re-run (command, check button, round) evaluates a head again that was already measured: a
        replayed or repeated event never does. A closed PR gets none (None): it cannot merge, GPUs are shared."""
        if not pr.is_open:
            return None
        for ev in self.active(session, pr):
            if ev.head_sha != pr.head_sha:
                self.end(session, pr, ev, EvalState.SUPERSEDED, by=requested_by)
            else:
                if ev.unsent:
                    self._dispatch(session, pr, ev, resend=True)  # its task never reached the broker: send it
                elif self._own_attempt_never_sent(session, ev):
                    self._send_again(session, pr, ev)
                self.refresh_sticky(session, pr)
                return ev  # this head is already queued or running
        delivery_id = session.info.get(HANDLING_DELIVERY)
        if delivery_id is not None:  # this delivery was handled before, past its dispatch's commit, and died
            earlier = session.scalar(select(Evaluation).where(
                Evaluation.pull_request_id == pr.id, Evaluation.head_sha == pr.head_sha,
                Evaluation.delivery_id == delivery_id).limit(1))
            if earlier is not None:
                return earlier
        # A round's re-evaluation against a base already measured (another beat's, done meanwhile) is one too.
        if trigger in (Trigger.AUTO, Trigger.APPROVAL, Trigger.ROUND):
            done = session.scalar(select(Evaluation).where(
                Evaluation.pull_request_id == pr.id, Evaluation.head_sha == pr.head_sha,
                Evaluation.base_sha == pr.base_sha, Evaluation.state == EvalState.DONE).limit(1))
            if done is not None:
                return done
        ev = Evaluation(pull_request_id=pr.id, head_sha=pr.head_sha, base_sha=pr.base_sha, base_ref=pr.base_ref,
                        state=EvalState.QUEUED, trigger=trigger, requested_by=requested_by,
                        profile=self.settings.eval.profile, attempt=1, delivery_id=delivery_id)
        session.add(ev)
        session.flush()
        self._dispatch(session, pr, ev)
        self.refresh_sticky(session, pr)
        return ev

    def _own_attempt_never_sent(self, session: Session, ev: Evaluation) -> bool:
        """This delivery's own evaluation, found again when its handler runs a second time, and its task nowhere:
        not in the broker, with no worker, not finished. The first run stored the attempt as sent and then died
        before the send, or could not confirm its commit (the database still away) and raised before it: left so,
        the attempt waits for the watchdog to call it lost, an INFRA attempt charged to the PR. Looked at twice,
        as the watchdog does (a worker moves a message in two steps); a broker it cannot see says nothing."""
        # attempt 1: the delivery's own dispatch; a later one is an INFRA retry's (Service._apply), whose
        # dispatcher may still be publishing it
        if not (ev.delivery_id is not None and ev.delivery_id == session.info.get(HANDLING_DELIVERY)
                and ev.state is EvalState.QUEUED and ev.claimed_by is None and ev.celery_task_id and ev.attempt == 1):
            return False
        probe, task = TaskProbe(self.celery, self.settings.worker_keys), ev.celery_task_id
        if not probe.can_see:
            return False
        if probe.anywhere(task):
            return False
        age = (utcnow() - aware(ev.dispatched_at)).total_seconds() if ev.dispatched_at else None
        if age is not None and age < self.settings.send_in_flight_s:
            # its first handler may still be publishing it (a claim can lapse under a live one): look later
            raise TimeoutError(f"evaluation {ev.id}: attempt {task} not in the broker {age:.0f} s after its "
                               "dispatch; the delivery looks again later")
        time.sleep(RECHECK_S)
        return not probe.anywhere(task)

    def _send_again(self, session: Session, pr: PullRequest, ev: Evaluation) -> None:
        """A new attempt id and check run for an attempt whose task was never sent; its old check run (queued, or
        already withdrawn by the commit that could not be confirmed) is completed as cancelled."""
        old_check = ev.check_run_id
        self._dispatch(session, pr, ev)
        if old_check is not None and old_check != ev.check_run_id:
            withdraw_check(self.gh_repo(pr.repository), old_check)

    @staticmethod
    def active(session: Session, pr: PullRequest) -> list[Evaluation]:
        return list(session.scalars(select(Evaluation).where(
            Evaluation.pull_request_id == pr.id,
            Evaluation.state.in_([EvalState.QUEUED, EvalState.RUNNING])).order_by(Evaluation.id)))

    def job(self, pr: PullRequest, ev: Evaluation) -> dict:
        repo = pr.repository
        return {"repo_url": repo.clone_url or pr.head_clone_url, "repo_full_name": repo.full_name,
                "pr_number": pr.number, "base_ref": ev.base_ref, "base_sha": ev.base_sha, "head_sha": ev.head_sha,
                "head_ref": pr.head_ref, "profile": ev.profile, "models": list(self.settings.models) or None,
                "attempt": ev.attempt, "eval_id": ev.id,
                # The GPU side reads no settings of its own: it evaluates with these.
                "settings": self.settings.eval.model_dump(mode="json")}

    def _dispatch(self, session: Session, pr: PullRequest, ev: Evaluation, countdown: float = 0,
                  resend: bool = False) -> None:
        """Check run (queued) → commit → task on `gpu` whose result comes back on `publish`. A task the broker
        refuses leaves the attempt `dispatched_at` NULL (committed): the delivery's retry or the watchdog sends
        it again (`resend`: the same attempt and check run; nothing was evaluated).

        It commits the caller's transaction: every row lock the caller holds is released and everything it read
        is expired (read again on next use); only the PR's lock is taken again. No caller may rely on another
        lock across it: a delivery is claimed (a lease) before its handler runs (bot/queue/tasks.py `_claim`), a
        round is written closed before its re-evaluations are queued (rounds.close_round), and the evaluation's
        lock (`_current`) guards nothing after it."""
        repo = self.gh_repo(pr.repository)
        job = self.job(pr, ev)  # read first: between creating a check run and the commit, nothing else may fail
        created = None
        if not (resend and ev.check_run_id):
            view = render.run_view(ev, self.max_attempts, queue_info(session, ev, self.settings.gpu_workers))
            created = ev.check_run_id = publish.create_check(
                repo, name=self.settings.check_name, head_sha=ev.head_sha, external_id=str(ev.id),
                details_url=self._pr_url(pr), output=render.check_output(view))
        ev.celery_task_id = str(uuid.uuid4())
        ev.claimed_by = None  # a new attempt: bound to whichever worker claims it
        ev.dispatched_at = utcnow()
        self._commit(session, repo, created, ev)  # the result may come back before this session would otherwise commit
        try:
            self.celery.send_task(
                EVALUATE_TASK, args=[job], task_id=ev.celery_task_id, queue=GPU_QUEUE, countdown=countdown or None,
                link=signature(RESULT_TASK, args=[ev.id, ev.celery_task_id], queue=PUBLISH_QUEUE, app=self.celery),
                link_error=signature(FAILURE_TASK, args=[ev.id, ev.celery_task_id], queue=PUBLISH_QUEUE,
                                     app=self.celery))
        except Exception:
            # Not sent: the attempt is not waited for as if it were (the watchdog would call it lost, an INFRA
            # attempt charged to the PR for the broker's outage).
            ev.dispatched_at = None
            session.commit()
            raise
        # The commit released every lock: what this session read before it may have changed since (the attempt
        # started or even finished). Everything is read again, after the PR's lock is taken again.
        session.expire_all()
        self.lock_pull(session, pr.id)
        self._withdraw_strays(session, repo, pr, ev)

    def _withdraw_strays(self, session: Session, repo, pr: PullRequest, ev: Evaluation) -> None:
        """Complete, as cancelled, this PR's check runs on this head that no evaluation refers to: each was created
        for an evaluation whose commit failed while GitHub refused its withdrawal too (`_commit`), and `queued` it
        would wait for ever. Run under the PR's lock, which every creator of its check runs holds from the create
        to its commit: none of them is still on its way to being recorded. Best effort, like the withdrawal."""
        url = self._pr_url(pr)
        if not url:  # the check runs name their PR by its URL: without one, this PR's cannot be told apart
            return
        try:
            runs = [cid for cid, details in publish.open_checks(repo, ev.head_sha, self.settings.check_name)
                    if details == url and cid != ev.check_run_id]
            if not runs:
                return
            known = set(session.scalars(select(Evaluation.check_run_id).where(Evaluation.check_run_id.in_(runs))))
        except Exception:  # noqa: BLE001 - GitHub or the database away: the next dispatch looks again
            log.warning("evaluation %s: stray check runs not looked for", ev.id, exc_info=True)
            return
        for cid in runs:
            if cid not in known:
                withdraw_check(repo, cid)

    @staticmethod
    def _commit(session: Session, repo, created_check: int | None, ev: Evaluation) -> None:
        """Commit; if that fails, the check run this transaction created (`created_check`) is completed as
        cancelled: its evaluation was rolled back, nothing refers to it, and `queued` it would wait for ever
        beside the one the caller's retry creates. The commit's error is raised either way.

        Unless the commit was stored and only its answer lost (the connection dropped after COMMIT reached the
        server): then it goes on as committed. Withdrawn, the check run would be a cancelled one the evaluation
        refers to; raised, the attempt's task would never be sent and only the watchdog would call it lost (an
        INFRA attempt charged to the PR)."""
        eval_id, attempt = ev.id, ev.celery_task_id  # read before: a rollback expires them
        try:
            session.commit()
        except Exception:
            session.rollback()
            if attempt_stored(session, eval_id, attempt):
                log.warning("evaluation %s: its commit was stored though its answer was lost; going on", eval_id)
                if inspect(ev).transient:  # created in the rolled-back transaction: it is the stored row
                    make_transient_to_detached(ev)
                    session.add(ev)
                return
            if created_check is not None:
                withdraw_check(repo, created_check)
            raise

    @staticmethod
    def _pr_url(pr: PullRequest) -> str | None:
        return pr.html_url

    def end(self, session: Session, pr: PullRequest, ev: Evaluation, state: EvalState, by: str | None = None) -> None:
        """Cancel or supersede an active evaluation: state, revoke, check run closed."""
        was_running = ev.state is EvalState.RUNNING
        transition(ev, state)
        ev.finished_at = utcnow()
        if state is EvalState.CANCELLED and by:
            ev.requested_by = by
        if ev.celery_task_id:
            # terminate only matters for a running task (prefork pool); the result is ignored anyway.
            self.celery.control.revoke(ev.celery_task_id, terminate=was_running)
        if ev.check_run_id:
            view = render.run_view(ev, self.max_attempts)
            publish.complete_check(self.gh_repo(pr.repository), ev.check_run_id, CheckConclusion.CANCELLED.value,
                                   render.check_output(view))

    def cancel(self, session: Session, pr: PullRequest, by: str | None) -> int:
        evs = self.active(session, pr)
        for ev in evs:
            self.end(session, pr, ev, EvalState.CANCELLED, by=by)
        self.refresh_sticky(session, pr)
        return len(evs)

    # ---- results coming back from the gpu queue ---------------------------------------------------
    def _current(self, session: Session, eval_id: int, task_id: str | None) -> tuple[Evaluation, PullRequest] | str:
        # The PR's lock before its evaluation's, the order the webhook handlers take them (repository → PR → its
        # evaluations): the other way round a start claim and a `closed` cancelling the same evaluation
        # deadlocked, and PostgreSQL aborted one of them (a delivery or a claim failed) after 1 s.
        pr_id = session.scalar(select(Evaluation.pull_request_id).where(Evaluation.id == eval_id))
        pr = self.lock_pull(session, pr_id) if pr_id is not None else None
        ev = session.get(Evaluation, eval_id, with_for_update=True, populate_existing=True) if pr else None
        if ev is None:
            return f"evaluation {eval_id} unknown"
        if not ev.state.active:
            return f"evaluation {eval_id} is {ev.state.value}: ignored"
        if task_id is not None and task_id != ev.celery_task_id:
            return f"evaluation {eval_id}: stale attempt {task_id} ignored"
        if ev.head_sha != pr.head_sha:
            return f"evaluation {eval_id}: head {ev.head_sha[:7]} is no longer current ({pr.head_sha[:7]}): ignored"
        return ev, pr

    def evaluation_started(self, session: Session, eval_id: int, hostname: str | None, task_id: str | None,
                           claim: dict | None = None) -> str:
        """A GPU worker's signed claim of this attempt: binds the attempt to it (the first valid claim wins)."""
        from bot import metrics
        found = self._current(session, eval_id, task_id)
        if isinstance(found, str):
            return found
        ev, pr = found
        worker = self.authenticate_claim(claim, eval_id, task_id)
        if worker is None:
            metrics.CLAIMS_REJECTED.labels("unauthenticated").inc()
            log.warning("evaluation %s: start claim not signed with a known worker key: ignored", eval_id)
            return f"evaluation {eval_id}: start claim not signed with a known worker's key: ignored"
        refused = self.bind(ev, worker, metrics.CLAIMS_REJECTED)
        if refused:
            return refused
        if ev.state is not EvalState.QUEUED:
            return f"evaluation {eval_id} already {ev.state.value}"
        transition(ev, EvalState.RUNNING)
        ev.started_at = utcnow()
        ev.worker_host = hostname
        view = render.run_view(ev, self.max_attempts, queue_info(session, ev, self.settings.gpu_workers))
        if ev.check_run_id:
            publish.start_check(self.gh_repo(pr.repository), ev.check_run_id, render.check_output(view))
        self.refresh_sticky(session, pr)
        return f"evaluation {eval_id} running on {hostname}"

    def _infra(self, ev: Evaluation, pr: PullRequest, reason: InfraReason, kind: InfraKind, detail: str,
               **context) -> EvalResult:
        """An INFRA result the bot records itself (never the PR's fault; retried per settings)."""
        return EvalResult(repo=pr.repository.full_name, pr_number=pr.number, base_sha=ev.base_sha,
                          head_sha=ev.head_sha, profile=ev.profile, verdict=Verdict.INFRA,
                          summary=render.infra_summary(reason, **context), infra_kind=kind,
                          infra_detail=detail[:500], attempt=ev.attempt)

    def evaluation_failed(self, session: Session, eval_id: int, task_id: str | None, detail: str) -> str:
        """The gpu task raised or its worker died: that is INFRA, never the PR's fault."""
        found = self._current(session, eval_id, task_id)
        if isinstance(found, str):
            return found
        ev, pr = found
        return self._apply(session, ev, pr, self._infra(ev, pr, InfraReason.TASK_FAILED, InfraKind.INTERNAL_ERROR,
                                                        detail))

    def _signer(self, auth, expected) -> str | None:
        """The worker named in `auth` when its mac is `expected(that worker's key)`, else None."""
        if not isinstance(auth, dict) or not isinstance(auth.get("mac"), str):
            return None
        key = self.settings.worker_keys.get(str(auth.get("worker")))
        if not key:
            return None
        good = expected(key)
        return str(auth["worker"]) if hmac.compare_digest(good.encode(), auth["mac"].encode("utf-8", "replace")) \
            else None

    def authenticate(self, result_dict, eval_id: int, task_id: str | None) -> str | None:
        """The worker whose own key signed this result for this evaluation and attempt, else None."""
        from worker.queue.auth import RESULT_AUTH, result_mac
        auth = result_dict.get(RESULT_AUTH) if isinstance(result_dict, dict) else None
        return self._signer(auth, lambda key: result_mac(key, result_dict, eval_id, task_id))

    def authenticate_claim(self, claim, eval_id: int, task_id: str | None) -> str | None:
        """The worker whose own key signed this start claim for this evaluation and attempt, else None."""
        from worker.queue.auth import claim_mac
        return self._signer(claim, lambda key: claim_mac(key, eval_id, task_id))

    @staticmethod
    def bind(ev: Evaluation, worker: str, rejected) -> str | None:
        """Bind the attempt to `worker` if it is free; a refusal (counted in `rejected`) if another holds it.
        Stored in the caller's transaction, under the evaluation's row lock (`_current`)."""
        if ev.claimed_by is None:
            ev.claimed_by = worker
            return None
        if ev.claimed_by == worker:
            return None
        rejected.labels("other_worker").inc()
        log.warning("evaluation %s: attempt %s is bound to worker %s; %s's message refused", ev.id,
                    ev.celery_task_id, ev.claimed_by, worker)
        return f"evaluation {ev.id}: attempt bound to worker {ev.claimed_by}, not {worker}: refused"

    def publish_result(self, session: Session, result_dict: dict, eval_id: int, task_id: str | None) -> str:
        """Accepted only for an evaluation we dispatched and still wait for (this attempt's task id), and
        only when signed with the own key of the GPU worker that claimed the attempt: the broker URL alone
        publishes nothing, and one worker's key publishes nothing for another worker's attempt."""
        from bot import metrics
        found = self._current(session, eval_id, task_id)
        if isinstance(found, str):
            metrics.RESULTS_REJECTED.labels("not_waiting").inc()
            return found
        ev, pr = found
        worker = self.authenticate(result_dict, eval_id, task_id)
        if worker is None:
            metrics.RESULTS_REJECTED.labels("unauthenticated").inc()
            log.warning("evaluation %s: result not signed with a known worker key: refused", eval_id)
            return f"evaluation {eval_id}: result not signed with a known worker's key: refused"
        # Only the worker this attempt is bound to (its claim; or this result, when it beat the claim here).
        refused = self.bind(ev, worker, metrics.RESULTS_REJECTED)
        if refused:
            return refused
        ev.result_worker = worker
        result_dict = {k: v for k, v in result_dict.items() if k != "_auth"}
        try:
            result = EvalResult.from_dict(result_dict)
        except (KeyError, TypeError, ValueError) as exc:
            result = self._infra(ev, pr, InfraReason.MALFORMED_RESULT, InfraKind.INTERNAL_ERROR,
                                 f"{type(exc).__name__}: {exc}")
        else:
            if result.head_sha != ev.head_sha or result.base_sha != ev.base_sha:
                result = self._infra(ev, pr, InfraReason.WRONG_REVISIONS, InfraKind.INTERNAL_ERROR,
                                     f"asked {ev.base_sha[:7]}..{ev.head_sha[:7]}, "
                                     f"got {result.base_sha[:7]}..{result.head_sha[:7]}")
        return self._apply(session, ev, pr, result)

    def mark_lost(self, session: Session, eval_id: int, task_id: str, reason: InfraReason, kind: InfraKind,
                  detail: str, **context) -> str:
        """The watchdog found this attempt's task gone or overdue: revoke it, record INFRA, retry per settings."""
        found = self._current(session, eval_id, task_id)
        if isinstance(found, str):
            return found
        ev, pr = found
        # A hung task may still hold its GPU: terminate it if it is anywhere; its late result is ignored anyway.
        self.celery.control.revoke(task_id, terminate=True)
        return self._apply(session, ev, pr, self._infra(ev, pr, reason, kind, detail, **context))

    def resend(self, session: Session, eval_id: int, task_id: str | None) -> str:
        """The watchdog: an attempt whose task the broker refused is sent now (the same attempt)."""
        found = self._current(session, eval_id, task_id)
        if isinstance(found, str):
            return found
        ev, pr = found
        if not ev.unsent:
            return f"evaluation {eval_id}: already sent"
        self._dispatch(session, pr, ev, resend=True)
        self.refresh_sticky(session, pr)
        return f"evaluation {eval_id}: sent again (the broker had refused it)"

    def _store(self, ev: Evaluation, result: EvalResult) -> None:
        ev.result = result.to_dict()
        ev.verdict = result.verdict.value
        ev.summary = result.summary
        ev.best_speedup = result.best_speedup
        ev.infra_kind = result.infra_kind.value if result.infra_kind else None
        ev.infra_detail = result.infra_detail
        ev.duration_s = result.duration_s
        if ev.duration_s is None and ev.started_at is not None:
            ev.duration_s = (utcnow() - aware(ev.started_at)).total_seconds()
        ev.gates = [GateResultRow(**vars(g)) for g in result.gates]
        ev.guards = [GuardResultRow(**vars(g)) for g in result.guards]
        if result.receipt:
            if ev.receipt is None:
                ev.receipt = Receipt(data=result.receipt)
            else:
                ev.receipt.data = result.receipt

    def _apply(self, session: Session, ev: Evaluation, pr: PullRequest, result: EvalResult) -> str:
        repo = self.gh_repo(pr.repository)
        self._store(ev, result)
        infra = result.verdict is Verdict.INFRA
        if infra and ev.attempt < self.max_attempts:
            # Not the PR's fault: say so on the check (action_required) and try again after a backoff.
            old_check = ev.check_run_id
            transition(ev, EvalState.QUEUED)
            ev.attempt += 1
            ev.started_at = None
            view = render.run_view(ev, self.max_attempts)
            if old_check:
                publish.complete_check(repo, old_check, CheckConclusion.ACTION_REQUIRED.value,
                                       render.check_output(view), rerun_button=False)
            publish.replace_managed_labels(repo, pr.number, labels_for(result, self.settings.eval))
            self.refresh_sticky(session, pr)
            self._dispatch(session, pr, ev, countdown=self.settings.eval.retry_backoff_s * (ev.attempt - 1))
            return f"evaluation {ev.id}: INFRA ({ev.infra_kind}), retry {ev.attempt}/{self.max_attempts} queued"
        transition(ev, EvalState.INFRA if infra else EvalState.DONE)
        ev.finished_at = utcnow()
        view = render.run_view(ev, self.max_attempts)
        if ev.check_run_id:
            publish.complete_check(repo, ev.check_run_id, render.conclusion_for(view), render.check_output(view),
                                   rerun_button=infra)
        publish.replace_managed_labels(repo, pr.number, labels_for(result, self.settings.eval))
        self.refresh_sticky(session, pr)
        return f"evaluation {ev.id}: {result.verdict.value}"

    # ---- the sticky comment -----------------------------------------------------------------------
    def refresh_sticky(self, session: Session, pr: PullRequest) -> None:
        evs = list(session.scalars(select(Evaluation).where(Evaluation.pull_request_id == pr.id)
                                   .order_by(Evaluation.id.desc()).limit(EARLIER_RUNS_SHOWN + 1)))
        current = None
        if evs:
            current = render.run_view(evs[0], self.max_attempts,
                                      queue_info(session, evs[0], self.settings.gpu_workers))
        earlier = [render.run_view(e, self.max_attempts) for e in evs[1:]]
        if current is None and not pr.awaiting_approval:
            return  # nothing to say yet
        body = render.sticky_comment(current=current, earlier=earlier, awaiting_approval=pr.awaiting_approval,
                                     approval_label=self.settings.approval_label, head_sha=pr.head_sha,
                                     models=self._models_shown(current))
        pr.sticky_comment_id = publish.upsert_sticky(self.gh_repo(pr.repository), pr.number, pr.sticky_comment_id,
                                                     body, self.github.bot_login())

    def _models_shown(self, current) -> list[str]:
        """The models named under the comment: those measured, else those asked for (empty: the profile's)."""
        result = current.result if current is not None else None
        if result is not None and (result.gates or result.guards):
            return list(dict.fromkeys([g.model for g in result.gates] + [g.model for g in result.guards]))
        return list(self.settings.models)

    def now(self) -> datetime:
        return datetime.now(timezone.utc)
