"""Base and head as git worktrees at exact commit SHAs, from a read-only clone.

The clone is a bare mirror under the cache dir (fetched, never pushed; no credentials are
configured for it). Each revision gets its own detached worktree, so each revision's `runtime`
is imported only from its own tree.
"""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from worker.paths import cache_dir, locked

_SHA = re.compile(r"^[0-9a-f]{40}$")


class CheckoutError(RuntimeError):
    """The revisions could not be checked out (INFRA: not a measurement of the PR)."""


def _git(*args: str, cwd: Path | None = None, timeout: float = 600) -> str:
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/local/bin:/usr/bin:/bin",
                            "HOME": str(cache_dir())})
    if p.returncode != 0:
        raise CheckoutError(f"git {' '.join(args[:3])} failed: {p.stderr.strip()[-500:]}")
    return p.stdout.strip()


def mirror(repo: str) -> Path:
    """A bare mirror of `repo` (path or URL) under the cache dir, fetched up to date."""
    repo = str(Path(repo).resolve()) if Path(repo).exists() else repo
    key = hashlib.sha256(repo.encode()).hexdigest()[:16]
    dest = cache_dir() / "repos" / f"{key}.git"
    with locked(dest.with_suffix(".lock")):
        if not (dest / "HEAD").exists():
            shutil.rmtree(dest, ignore_errors=True)
            _git("clone", "--mirror", "--quiet", repo, str(dest))
        else:
            _git("--git-dir", str(dest), "fetch", "--prune", "--quiet", "origin")
    return dest


def resolve(git_dir: Path, ref: str) -> str:
    """Exact commit SHA of a ref (branch, tag, refs/pull/N/head, or a SHA) in the mirror."""
    for cand in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}"):
        try:
            sha = _git("--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", f"{cand}^{{commit}}")
        except CheckoutError:
            continue
        if _SHA.match(sha):
            return sha
    raise CheckoutError(f"ref {ref!r} not found in the repository")


def subtree_id(git_dir: Path, sha: str, path: str) -> str | None:
    """The git tree id of `path` at commit `sha` (what changes exactly when a file under it does);
    None where the commit has no such folder."""
    try:
        tree = _git("--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", f"{sha}:{path}")
        kind = _git("--git-dir", str(git_dir), "cat-file", "-t", tree)
    except CheckoutError:
        return None
    return tree if _SHA.match(tree) and kind == "tree" else None


@dataclass
class Revision:
    role: str
    ref: str
    sha: str
    root: Path


def add_worktree(git_dir: Path, sha: str, dest: Path, role: str, ref: str) -> Revision:
    if not _SHA.match(sha):
        raise CheckoutError(f"not a full commit SHA: {sha!r}")
    with locked(git_dir.with_suffix(".lock")):
        _git("--git-dir", str(git_dir), "worktree", "prune")
        _git("--git-dir", str(git_dir), "worktree", "add", "--detach", "--force", str(dest), sha)
    got = _git("rev-parse", "HEAD", cwd=dest)
    if got != sha:
        raise CheckoutError(f"{role} worktree is at {got}, expected {sha}")
    return Revision(role, ref, sha, dest)


def remove_worktree(git_dir: Path, rev: Revision) -> None:
    with locked(git_dir.with_suffix(".lock")):
        try:
            _git("--git-dir", str(git_dir), "worktree", "remove", "--force", str(rev.root))
        except CheckoutError:
            shutil.rmtree(rev.root, ignore_errors=True)
            _git("--git-dir", str(git_dir), "worktree", "prune")


def checkout_pair(repo: str, base_ref: str, head_ref: str, workdir: Path,
                  base_sha: str | None = None, head_sha: str | None = None) -> tuple[Path, Revision, Revision]:
    """Mirror `repo`, resolve both refs (or take the given SHAs), add the two worktrees."""
    try:
        git_dir = mirror(repo)
        bsha = base_sha or resolve(git_dir, base_ref)
        hsha = head_sha or resolve(git_dir, head_ref)
        base = add_worktree(git_dir, bsha, workdir / "base", "base", base_ref)
        head = add_worktree(git_dir, hsha, workdir / "head", "head", head_ref)
    except subprocess.TimeoutExpired as exc:
        raise CheckoutError(f"git timed out: {exc}") from exc
    return git_dir, base, head
