"""GitHub writes: the sticky comment, check runs, labels, merges (bot side, `publish` queue only)."""
from __future__ import annotations

from datetime import datetime, timezone

from github import GithubException
from github.Repository import Repository as GhRepository

from bot import render
from bot.enums import GREEN_CONCLUSIONS, RERUN_ACTION_ID, CheckStatus, is_managed_label
from bot.render import STICKY_MARKER



def rerun_action() -> dict[str, str]:
    """The check run's Re-run button (wording from templates/check_actions.j2)."""
    words = render.environment().get_template("check_actions.j2").module
    return {"label": str(words.rerun_label()).strip()[:20],
            "description": str(words.rerun_description()).strip()[:40], "identifier": RERUN_ACTION_ID}


def upsert_sticky(repo: GhRepository, number: int, comment_id: int | None, body: str, bot_login: str) -> int:
    """Edit our one comment on the PR in place (create it the first time); returns its id. Only a comment
    written by `bot_login` (ours) is adopted: anyone can post one that starts with the marker."""
    issue = repo.get_issue(number)
    if comment_id is not None:
        try:
            issue.get_comment(comment_id).edit(body)
            return comment_id
        except GithubException as exc:
            if exc.status != 404:  # someone deleted it: fall through and recreate
                raise
    else:
        # The database may have been reset: adopt an existing sticky comment rather than add a second one.
        for comment in issue.get_comments():
            if (comment.body or "").startswith(STICKY_MARKER) and comment.user.login == bot_login:
                comment.edit(body)
                return comment.id
    return issue.create_comment(body).id


def reply(repo: GhRepository, number: int, body: str) -> int:
    return repo.get_issue(number).create_comment(body).id


def create_check(repo: GhRepository, *, name: str, head_sha: str, external_id: str, details_url: str | None,
                 output: dict[str, str]) -> int:
    kwargs = {"details_url": details_url} if details_url else {}
    run = repo.create_check_run(name=name, head_sha=head_sha, status=CheckStatus.QUEUED.value,
                                external_id=external_id, output=output, **kwargs)
    return run.id


def open_checks(repo: GhRepository, head_sha: str, name: str) -> list[tuple[int, str | None]]:
    """(id, details_url) of the check runs named `name` on `head_sha` that are not completed (every run: GitHub
    lists only the newest of each name unless asked for all)."""
    return [(run.id, run.details_url) for run in repo.get_commit(head_sha).get_check_runs(check_name=name, filter="all")
            if run.name == name and run.status != CheckStatus.COMPLETED.value]


def start_check(repo: GhRepository, check_run_id: int, output: dict[str, str]) -> None:
    repo.get_check_run(check_run_id).edit(status=CheckStatus.IN_PROGRESS.value,
                                          started_at=datetime.now(timezone.utc), output=output)


def complete_check(repo: GhRepository, check_run_id: int, conclusion: str, output: dict[str, str],
                   rerun_button: bool = False) -> None:
    kwargs = {"actions": [rerun_action()]} if rerun_button else {}
    repo.get_check_run(check_run_id).edit(status=CheckStatus.COMPLETED.value, conclusion=conclusion,
                                          completed_at=datetime.now(timezone.utc), output=output, **kwargs)


def replace_managed_labels(repo: GhRepository, number: int, wanted: list[str]) -> list[str]:
    """Set our labels in one PUT (atomic on GitHub's side), keeping everyone else's; returns the new set."""
    issue = repo.get_issue(number)
    current = [label.name for label in issue.labels]
    keep = [name for name in current if not is_managed_label(name)]
    new = keep + [name for name in dict.fromkeys(wanted) if name not in keep]
    if sorted(new) != sorted(current):
        issue.set_labels(*new)
    return new


def remove_label(repo: GhRepository, number: int, name: str) -> None:
    try:
        repo.get_issue(number).remove_from_labels(name)
    except GithubException as exc:
        if exc.status != 404:
            raise


def add_label(repo: GhRepository, number: int, name: str) -> None:
    repo.get_issue(number).add_to_labels(name)


def branch_tip(repo: GhRepository, ref: str) -> str:
    """Current SHA of a branch, via the combined-status endpoint (it resolves the ref)."""
    return repo.get_commit(ref).get_combined_status().sha


def checks_green(repo: GhRepository, sha: str, ignore_check: str | None = None) -> tuple[bool, str]:
    """All commit statuses success and all check runs completed green (ours excluded by name)."""
    commit = repo.get_commit(sha)
    combined = commit.get_combined_status()
    bad = [f"status {s.context}: {s.state}" for s in combined.statuses if s.state != "success"]
    for run in commit.get_check_runs():
        if run.name == ignore_check:
            continue
        if run.status != CheckStatus.COMPLETED.value or run.conclusion not in GREEN_CONCLUSIONS:
            bad.append(f"check {run.name}: {run.conclusion or run.status}")
    return (not bad, "; ".join(bad) or "all green")


class MergeRefused(RuntimeError):
    """GitHub will not merge this PR (conflict, branch protection, draft, head moved): no retry changes that."""


def merge(repo: GhRepository, number: int, head_sha: str, method: str, title: str) -> str:
    """Merge only if the head is still `head_sha` (GitHub refuses otherwise); returns the merge commit."""
    try:
        status = repo.get_pull(number).merge(merge_method=method, sha=head_sha, commit_title=title)
    except GithubException as exc:
        if exc.status in (405, 409, 422):  # not mergeable / head modified / invalid: the PR's state, not an outage
            raise MergeRefused(f"{exc.status} {(exc.data or {}).get('message', '')}".strip()) from exc
        raise
    if not status.merged:
        raise MergeRefused(status.message or "not merged")
    return status.sha
