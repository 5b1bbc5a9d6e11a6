"""Fixtures for the worker tests: git repositories whose revisions are fake runtimes."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from worker.config import EvalSettings, ModelSpec, ProfileSettings

FAKES = Path(__file__).parent / "fake_runtimes"
GOOD = FAKES / "good"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x", "HOME": str(repo)}
                          ).stdout.strip()


def overlay(repo: Path, variant: str) -> None:
    src = FAKES / "variants" / variant
    if not src.is_dir():
        raise ValueError(f"no fake variant {variant!r}")
    shutil.copytree(src, repo, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))


def make_repo(root: Path, head: str | None = None, base: str | None = None) -> Path:
    """A repository: `main` = good fake runtime (+ base variant), `pr` = main + head variant."""
    repo = root / "repo"
    shutil.copytree(GOOD, repo, ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q", "-b", "main")
    if base:
        overlay(repo, base)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    _git(repo, "checkout", "-q", "-b", "pr")
    if head:
        overlay(repo, head)
        _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", f"head: {head}")
    _git(repo, "checkout", "-q", "main")
    return repo


def clone_with_pr(root: Path, edit, message: str) -> tuple[Path, str]:
    """A clone of THIS checkout (the real runtime) with branch `pr` = `edit(clone)` committed; (clone, base sha)."""
    repo = root / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(Path(__file__).resolve().parents[2]), str(repo)],
                   check=True)
    base = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", "pr")
    edit(repo)
    _git(repo, "commit", "-q", "-am", message)
    return repo, base


def fake_model(path: Path, seed: int = 0) -> Path:
    path.write_bytes(b"FAKEGGUF" + seed.to_bytes(8, "little"))
    return path


def make_profile(model: Path, **kw) -> ProfileSettings:
    d = dict(device="cpu", models=[ModelSpec(name="fake", path=str(model), decode_contexts=[32, 160],
                                             prefill_contexts=[64, 256])],
             decode_tokens=24, pairs=5, warmup=1, seeds=[0, 1, 2], prompts_per_seed=2, prompt_len=32,
             load_timeout_s=30, request_timeout_s=15, memory_limit_bytes=4 << 30, clock="oncpu", inner=3)
    d.update(kw)
    return ProfileSettings(**d)


def make_settings(profile: ProfileSettings, **kw) -> EvalSettings:
    return EvalSettings(profiles={"test": profile}, profile="test", retries=0, retry_backoff_s=0.01, **kw)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tgcache")
