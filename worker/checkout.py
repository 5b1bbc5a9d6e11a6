"""Base and head as git worktrees at exact commit SHAs, from a read-only clone.

The clone is a bare mirror under the cache dir (fetched, never pushed; no credentials are
configured for it). Each revision gets its own detached worktree, so each revision's `runtime`
is imported only from its own tree.

The head's worktree holds what would land: the head merged with the base when the head does
not contain the base already (main moved after the PR branched off). Timed as it is, a head
would be measured without base's later commits, and its "speedup" would include not having
them; a round merges the measured result only while the base is still where it was measured.
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


class MergeConflict(RuntimeError):
    """The head does not merge cleanly with the base: what would land does not exist, so nothing is measured.
    The PR's state (a rebase fixes it), not an infrastructure failure."""


# The merge commit's identity and dates are fixed: the same base and head always give the same commit, so its
# compile cache (keyed by the commit measured) is found again by the next evaluation of that pair.
_MERGE_ENV = {"GIT_AUTHOR_NAME": "tokengate", "GIT_AUTHOR_EMAIL": "tokengate@invalid",
              "GIT_COMMITTER_NAME": "tokengate", "GIT_COMMITTER_EMAIL": "tokengate@invalid",
              "GIT_AUTHOR_DATE": "1970-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "1970-01-01T00:00:00+0000"}


def _run(*args: str, cwd: Path | None = None, timeout: float = 600,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """git with no prompt, our PATH and the cache dir as HOME (no user config); the caller reads the exit code."""
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/local/bin:/usr/bin:/bin",
                               "HOME": str(cache_dir()), **(env or {})})


def _git(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    p = _run(*args, cwd=cwd, timeout=timeout, env=env)
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
    sha: str  # the commit the job named (the PR's head, main's tip)
    root: Path
    merged_sha: str | None = None  # the commit in `root` when it is `sha` merged with the base (see module doc)

    @property
    def measured_sha(self) -> str:
        """The commit whose code runs: what a revision's caches are keyed by."""
        return self.merged_sha or self.sha


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


def contains(git_dir: Path, newer: str, older: str) -> bool:
    """Whether commit `newer` has `older` in its history (or is it)."""
    p = _run("--git-dir", str(git_dir), "merge-base", "--is-ancestor", older, newer)
    if p.returncode not in (0, 1):
        raise CheckoutError(f"git merge-base --is-ancestor failed: {p.stderr.strip()[-500:]}")
    return p.returncode == 0


def merged_commit(git_dir: Path, head_sha: str, base_sha: str) -> str | None:
    """The commit that is `head_sha` merged with `base_sha`, made in the bare mirror as GitHub makes it (merge-ort
    with no worktree: the PR's own .gitattributes choose no merge driver, and no checked-out file can block it);
    None when the head contains the base already. MergeConflict when they do not merge cleanly (or have no history
    in common); any other failure is the host's (CheckoutError)."""
    if contains(git_dir, head_sha, base_sha):
        return None
    with locked(git_dir.with_suffix(".lock")):
        p = _run("--git-dir", str(git_dir), "merge-tree", "--write-tree", "--name-only", head_sha, base_sha)
        if p.returncode == 1:  # conflicts: the tree id, then the conflicted paths, then a blank line and messages
            clash = p.stdout.split("\n\n", 1)[0].splitlines()[1:]
            raise MergeConflict(f"head {head_sha[:12]} does not merge cleanly with base {base_sha[:12]}"
                                + (f" (conflicts in {', '.join(clash[:8])})" if clash else ""))
        if p.returncode != 0:
            if "unrelated histories" in p.stderr:
                raise MergeConflict(f"head {head_sha[:12]} and base {base_sha[:12]} have no history in common (unrelated histories)")
            raise CheckoutError(f"git merge-tree failed: {p.stderr.strip()[-500:]}")
        tree = p.stdout.split("\n", 1)[0].strip()
        return _git("--git-dir", str(git_dir), "commit-tree", tree, "-p", head_sha, "-p", base_sha,
                    "-m", f"tokengate: {head_sha[:12]} merged with {base_sha[:12]}", env=_MERGE_ENV)


def remove_worktree(git_dir: Path, rev: Revision) -> None:
    with locked(git_dir.with_suffix(".lock")):
        try:
            _git("--git-dir", str(git_dir), "worktree", "remove", "--force", str(rev.root))
        except CheckoutError:
            shutil.rmtree(rev.root, ignore_errors=True)
            _git("--git-dir", str(git_dir), "worktree", "prune")


def checkout_pair(repo: str, base_ref: str, head_ref: str, workdir: Path,
                  base_sha: str | None = None, head_sha: str | None = None) -> tuple[Path, Revision, Revision]:
    """Mirror `repo`, resolve both refs (or take the given SHAs), add the two worktrees (the head's as it would land on
    the base: merged with it where it does not contain it)."""
    try:
        git_dir = mirror(repo)
        bsha = base_sha or resolve(git_dir, base_ref)
        hsha = head_sha or resolve(git_dir, head_ref)
        base = add_worktree(git_dir, bsha, workdir / "base", "base", base_ref)
        merged = merged_commit(git_dir, hsha, bsha)
        head = add_worktree(git_dir, merged or hsha, workdir / "head", "head", head_ref)
        head.sha, head.merged_sha = hsha, merged
    except subprocess.TimeoutExpired as exc:
        raise CheckoutError(f"git timed out: {exc}") from exc
    return git_dir, base, head
