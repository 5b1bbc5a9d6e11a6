"""Main's commits between two SHAs, read from a bare mirror the publish side keeps (git itself).

The bot never checks anything out: it only needs the order of commits to bisect. First-parent
order: on a squash- or rebase-merging repository that is every commit; on a merge-commit one, a
merged PR is named by its merge commit.
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from worker.paths import cache_dir


class GitError(RuntimeError):
    pass


def _git(*args: str, cwd: Path | None = None, timeout: float = 300) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=timeout,
                             env={"PATH": "/usr/bin:/bin", "GIT_TERMINAL_PROMPT": "0", "HOME": "/nonexistent"})
    except subprocess.CalledProcessError as exc:
        raise GitError(f"git {' '.join(args[:2])}: {exc.stderr.strip()[-500:]}") from exc
    except subprocess.TimeoutExpired as exc:
        raise GitError(f"git {' '.join(args[:2])}: timed out after {timeout:.0f} s") from exc
    return out.stdout.strip()


def mirror(clone_url: str) -> Path:
    """A bare, blob-less mirror of the repository, fetched now."""
    path = cache_dir() / "bot-mirrors" / hashlib.sha256(clone_url.encode()).hexdigest()[:16]
    if not (path / "HEAD").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _git("clone", "-q", "--bare", "--filter=blob:none", clone_url, str(path))
    else:
        _git("fetch", "-q", "--prune", "origin", "+refs/heads/*:refs/heads/*", cwd=path)
    return path


def first_parent(clone_url: str, sha: str) -> str | None:
    """`sha`'s first parent; None for a root commit. Raises GitError when the mirror cannot be fetched or does not
    hold `sha`, rather than answering as if it were the root (the merge would be skipped)."""
    path = mirror(clone_url)
    _git("cat-file", "-e", f"{sha}^{{commit}}", cwd=path)
    try:
        return _git("rev-parse", "--verify", "-q", f"{sha}^1", cwd=path)
    except GitError:
        return None  # the root commit


def commits_between(clone_url: str, good: str, bad: str) -> list[str]:
    """(good, bad] on bad's first-parent line, oldest first; raises when good is not an ancestor of bad."""
    path = mirror(clone_url)
    if subprocess.run(["git", "merge-base", "--is-ancestor", good, bad], cwd=path).returncode != 0:
        raise GitError(f"{good[:7]} is not an ancestor of {bad[:7]}")
    out = _git("rev-list", "--first-parent", "--reverse", f"{good}..{bad}", cwd=path)
    return out.split() if out else []


def first_parent_line(clone_url: str, branch: str) -> dict[str, int]:
    """Each commit on `branch`'s first-parent line → its position, oldest 0: the order merges landed in."""
    out = _git("rev-list", "--first-parent", "--reverse", f"refs/heads/{branch}", cwd=mirror(clone_url))
    return {sha: i for i, sha in enumerate(out.split())}
