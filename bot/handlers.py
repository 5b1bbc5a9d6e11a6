"""Webhook events → service actions (runs on the `publish` queue, never in the web request).

Each handler returns a short outcome string, stored on the delivery row for operators.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from bot import render

from bot.github import publish
from bot.enums import RERUN_ACTION_ID, Command, EvalState, Trigger
from bot.db.models import Evaluation, PullRequest, Repository, utcnow
from bot.rounds import open_round
from bot.service import Service, login_of, parse_time
from bot.history import on_main_merged

log = logging.getLogger(__name__)

# At most 3 spaces before it: 4 or a tab make an indented code block, which shows a command and runs none.
COMMAND_RE = re.compile(r"^ {0,3}/eval(?:[ \t]+(?:(?P<sha>[0-9a-f]{7,40})|(?P<sub>[a-z]+)))?[ \t]*$",
                        re.IGNORECASE | re.MULTILINE)
# A fenced code block (``` or ~~~, to its closing fence or the end of the comment).
FENCED_RE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?(?:^ {0,3}\1[`~]*[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)


def parse_request(body) -> tuple[Command, str | None] | None:
    """`/eval`, `/eval <sha>`, `/eval rerun`, `/eval cancel`, `/eval status` on a line of their own, outside code."""
    m = COMMAND_RE.search(FENCED_RE.sub("", body) if isinstance(body, str) else "")
    if not m:
        return None
    if m.group("sha"):
        return Command.EVAL, m.group("sha").lower()
    try:
        return Command((m.group("sub") or "eval").lower()), None
    except ValueError:
        return None


def parse_command(body) -> Command | None:
    parsed = parse_request(body)
    return parsed[0] if parsed else None


def head_seen_by(pr: PullRequest, at: datetime | None) -> str | None:
    """The newest head pushed before `at` (what a maintainer commenting then could have seen)."""
    if at is None:
        return None
    seen = [sha for sha, first in (pr.head_history or []) if (parse_time(first) or at) <= at]
    return seen[-1] if seen else None


class Handlers:
    def __init__(self, service: Service):
        self.service = service
        self.settings = service.settings

    def dispatch(self, session: Session, event: str, payload: dict) -> str:
        route: dict[str, Callable[[Session, dict], str]] = {
            "pull_request": self.pull_request, "issue_comment": self.issue_comment, "check_run": self.check_run,
            "installation": self.installation, "installation_repositories": self.installation_repositories,
            "ping": lambda _s, _p: "pong",
        }
        handler = route.get(event)
        if handler is None:
            return f"ignored event {event}"
        return handler(session, payload)

    def _repo(self, session: Session, payload: dict) -> Repository:
        inst = (payload.get("installation") or {}).get("id")
        repo = self.service.upsert_repository(session, payload["repository"], inst)
        open_round(session, repo, self.settings.round_window_s)  # every repository has a merge-first window
        return repo

    # ---- pull_request ---------------------------------------------------------------------------
    def pull_request(self, session: Session, payload: dict) -> str:
        action = payload.get("action")
        if action not in ("opened", "reopened", "synchronize", "labeled", "closed", "edited"):
            return f"ignored pull_request.{action}"
        repo = self._repo(session, payload)
        previous_head = session.scalar(select(PullRequest.head_sha).where(
            PullRequest.repository_id == repo.id, PullRequest.number == payload["pull_request"]["number"])
            .with_for_update())
        pr = self.service.upsert_pull(session, repo, payload["pull_request"])
        merged = action == "closed" and bool(payload["pull_request"].get("merged"))
        if pr.id in session.info.get("stale_pulls", ()) and not merged:  # a merge is final: never stale
            return (f"{action}: payload head {payload['pull_request']['head']['sha'][:7]} is older than the stored "
                    f"{pr.head_sha[:7]}: ignored")
        sender = login_of(payload.get("sender"))

        if action == "closed":
            pr.is_open = False
            n = self.service.cancel(session, pr, by=None) if self.service.active(session, pr) else 0
            if merged and pr.base_ref == repo.default_branch:  # issue 16: main's history
                on_main_merged(session, self.settings, self.service.celery, repo, pr,
                               payload["pull_request"].get("merge_commit_sha"))
            return f"closed; {n} evaluation(s) cancelled"
        if not pr.is_open:
            return f"{action}: pull request is closed, nothing queued"
        if action == "labeled":
            return self._labeled(session, repo, pr, payload, sender)
        if action == "edited":
            # Retargeted: a verdict measured against the old base says nothing about merging into the new one.
            base_from = ((((payload.get("changes") or {}).get("base") or {}).get("ref") or {}).get("from"))
            if not base_from or base_from == pr.base_ref:
                return "edited: title or body only, nothing queued"
            for ev in self.service.active(session, pr):
                if ev.base_ref != pr.base_ref:
                    self.service.end(session, pr, ev, EvalState.SUPERSEDED)

        new_push = action == "synchronize" or (previous_head is not None and previous_head != pr.head_sha)
        if new_push:
            for ev in self.service.active(session, pr):
                if ev.head_sha != pr.head_sha:
                    self.service.end(session, pr, ev, EvalState.SUPERSEDED)
        if self.service.is_trusted(repo, pr.author_login):
            pr.awaiting_approval = False
            self.service.request_evaluation(session, pr, Trigger.AUTO, requested_by=pr.author_login)
            return f"{action}: trusted author, evaluation queued"
        if action == "synchronize" and sender and sender != pr.author_login and self.service.is_trusted(repo, sender):
            # A maintainer pushed to the contributor's branch: their push vouches for the new head.
            pr.approved_sha = pr.head_sha
            pr.awaiting_approval = False
            self.service.request_evaluation(session, pr, Trigger.AUTO, requested_by=sender)
            return f"{action}: pushed by trusted {sender}, evaluation queued"
        if pr.approved_sha == pr.head_sha:
            self.service.request_evaluation(session, pr, Trigger.APPROVAL)
            return f"{action}: approved head, evaluation queued"
        # Untrusted author and this head is not approved: the approval must be given again.
        labels = [(label or {}).get("name") for label in payload["pull_request"].get("labels") or []]
        if self.settings.approval_label in labels:
            publish.remove_label(self.service.gh_repo(repo), pr.number, self.settings.approval_label)
        pr.approved_sha = None
        pr.awaiting_approval = True
        self.service.refresh_sticky(session, pr)
        return f"{action}: untrusted author, waiting for approval"

    def _labeled(self, session: Session, repo: Repository, pr: PullRequest, payload: dict, sender: str) -> str:
        label = (payload.get("label") or {}).get("name")
        if label != self.settings.approval_label:
            return f"labeled {label}: not ours"
        if not self.service.is_trusted(repo, sender):
            publish.remove_label(self.service.gh_repo(repo), pr.number, label)
            return f"approval label from {sender} without write access: removed"
        pr.approved_sha = pr.head_sha
        pr.awaiting_approval = False
        self.service.request_evaluation(session, pr, Trigger.APPROVAL, requested_by=sender)
        return f"approved by {sender} at {pr.head_sha[:7]}: evaluation queued"

    # ---- issue_comment --------------------------------------------------------------------------
    def issue_comment(self, session: Session, payload: dict) -> str:
        if payload.get("action") != "created":
            return f"ignored issue_comment.{payload.get('action')}"
        issue = payload.get("issue") or {}
        if not issue.get("pull_request"):
            return "comment on an issue, not a pull request"
        comment = payload.get("comment") or {}
        parsed = parse_request(comment.get("body"))
        if parsed is None:
            return "no command"
        command, sha = parsed
        commenter = login_of(comment.get("user"))
        if (comment.get("user") or {}).get("type") == "Bot":
            return "comment by a bot"
        repo = self._repo(session, payload)
        gh = self.service.gh_repo(repo)
        if not self.service.is_trusted(repo, commenter):
            publish.reply(gh, issue["number"], render.render(
                "unauthorized_command.md.j2", login=commenter, command=command.value))
            return f"/eval {command.value} from {commenter} without write access: refused"
        pr = self.service.upsert_pull(session, repo, gh.get_pull(issue["number"]).raw_data)
        if command is Command.CANCEL:
            n = self.service.cancel(session, pr, by=commenter)
            return f"/eval cancel by {commenter}: {n} cancelled"
        if command is Command.STATUS:
            self.service.refresh_sticky(session, pr)
            return "status refreshed"
        # /eval approves the head the maintainer could have seen (pushed before the comment), or the named one.
        approved = sha if sha else head_seen_by(pr, parse_time(comment.get("created_at")))
        if approved is None or not pr.head_sha.startswith(approved):
            publish.reply(gh, pr.number, render.render("eval_head_moved.md.j2", login=commenter,
                                                       head_sha=pr.head_sha, approved=approved))
            return (f"/eval by {commenter} approved {(approved or 'no head')[:7]}, but the head is "
                    f"{pr.head_sha[:7]}: nothing queued")
        if not pr.is_open:
            publish.reply(gh, pr.number, render.render("eval_closed.md.j2", login=commenter))
            return f"/eval {command.value} by {commenter}: pull request is closed, nothing queued"
        pr.approved_sha = pr.head_sha
        pr.awaiting_approval = False
        ev = self.service.request_evaluation(session, pr, Trigger.COMMAND, requested_by=commenter)
        return f"/eval {command.value} by {commenter} at {pr.head_sha[:7]}: evaluation {ev.id}"

    # ---- check_run ------------------------------------------------------------------------------
    def check_run(self, session: Session, payload: dict) -> str:
        action = payload.get("action")
        run = payload.get("check_run") or {}
        if action == "requested_action" and (payload.get("requested_action") or {}).get("identifier") != RERUN_ACTION_ID:
            return "unknown requested action"
        if action not in ("rerequested", "requested_action"):
            return f"ignored check_run.{action}"
        ev = session.scalar(select(Evaluation).where(Evaluation.check_run_id == run.get("id")))
        if ev is None:
            return f"check run {run.get('id')} is not ours"
        pr = self.service.lock_pull(session, ev.pull_request_id)
        if ev.head_sha != pr.head_sha:
            return f"check run for an old head {ev.head_sha[:7]}: ignored"
        sender = login_of(payload.get("sender"))
        if not self.service.is_trusted(pr.repository, sender):
            return f"re-run requested by {sender} without write access: refused"
        new = self.service.request_evaluation(session, pr, Trigger.CHECK_RERUN, requested_by=sender)
        if new is None:
            return f"re-run requested by {sender}: pull request is closed, nothing queued"
        return f"re-run requested by {sender}: evaluation {new.id}"

    # ---- installation ---------------------------------------------------------------------------
    def installation(self, session: Session, payload: dict) -> str:
        action = payload.get("action")
        inst = self.service.upsert_installation(session, payload["installation"])
        if action == "deleted":
            inst.deleted_at = utcnow()
            return f"installation {inst.id} deleted"
        for r in payload.get("repositories") or []:
            self.service.upsert_repository(session, r, inst.id)
        return f"installation {inst.id} {action}"

    def installation_repositories(self, session: Session, payload: dict) -> str:
        inst = self.service.upsert_installation(session, payload["installation"])
        for r in payload.get("repositories_added") or []:
            self.service.upsert_repository(session, r, inst.id)
        for r in payload.get("repositories_removed") or []:
            row = session.get(Repository, r["id"])
            if row is not None:
                row.installation_id = None
        return f"installation {inst.id}: repositories updated"

