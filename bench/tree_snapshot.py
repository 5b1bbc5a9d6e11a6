"""A commit of the working tree as it is, for bench scripts that check revisions out of this checkout.

On the device the checkout's HEAD is the last *landed* commit and this session's work lies in the
working tree as uncommitted changes (docs/notes/gpu-20261202.md: a calibration measured the old
loader that way). This writes the tree, untracked-but-not-ignored files included, as a commit on
`refs/tokengate/snapshot` through a temporary index: HEAD, the index and the branches stay as they were.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

REF = "refs/tokengate/snapshot"
_WHO = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@tokengate.invalid",
        "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@tokengate.invalid"}


def _git_in(repo: Path, index: Path):
    env = {**os.environ, **_WHO, "GIT_INDEX_FILE": str(index)}

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True,
                              env=env).stdout.strip()
    return git


def _write_tree(git) -> str:
    git("read-tree", "HEAD")
    git("add", "-A")
    return git("write-tree")


def working_tree(repo: Path) -> str:
    """The git tree SHA of the working tree as it is (untracked-but-not-ignored files included; HEAD, the index
    and the branches untouched). On the device, where HEAD is the last landed commit, this names the code that
    ran: it equals `git rev-parse <commit>^{tree}` of the local commit whose tree was sent."""
    with tempfile.TemporaryDirectory() as d:
        return _write_tree(_git_in(repo, Path(d) / "index"))


def tree_facts(repo: Path) -> dict:
    """For a receipt: the tree that ran (`working_tree`), whether it is HEAD's and then HEAD's commit; on the device
    HEAD is the last landed commit, not what was sent. Null with the reason where git cannot say (no .git on the copy)."""
    try:
        tree = working_tree(repo)
        head, head_tree = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD", "HEAD^{tree}"], check=True,
                                         capture_output=True, text=True).stdout.split()
        is_head = tree == head_tree  # then HEAD is the commit that ran; else only the tree names it
        return {"git_tree": tree, "git_tree_is_head": is_head, "git_commit": head if is_head else None}
    except (OSError, subprocess.CalledProcessError) as e:
        return {"git_tree": None, "git_tree_reason": f"{type(e).__name__}: {e}"[:500]}


def snapshot_commit(repo: Path) -> str:
    """SHA of a commit holding the working tree of `repo` (parent: HEAD), also stored at REF."""
    with tempfile.TemporaryDirectory() as d:
        git = _git_in(repo, Path(d) / "index")
        tree = _write_tree(git)
        head = git("rev-parse", "HEAD")
        if tree == git("rev-parse", "HEAD^{tree}"):
            sha = head
        else:
            sha = git("commit-tree", tree, "-p", head, "-m", "working tree snapshot (bench/tree_snapshot.py)")
        git("update-ref", REF, sha)
        return sha
