"""Helpers for the worker tests: git repositories whose revisions are fake runtimes, fake models, small
profiles, and one evaluation of them."""
from __future__ import annotations

import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.paths import TINY
from worker.calibration.aa_store import AAStore
from worker.config import EvalSettings, ModelSpec, ProfileSettings
from worker.pipeline import Job, evaluate

FAKES = Path(__file__).parent / "fake_runtimes"
GOOD = FAKES / "good"


def git(repo: Path, *args: str) -> str:
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
    git(repo, "init", "-q", "-b", "main")
    if base:
        overlay(repo, base)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "pr")
    if head:
        overlay(repo, head)
        git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", f"head: {head}")
    git(repo, "checkout", "-q", "main")
    return repo


def clone_with_pr(root: Path, edit, message: str) -> tuple[Path, str]:
    """A clone of THIS checkout (the real runtime) with branch `pr` = `edit(clone)` committed; (clone, base sha)."""
    repo = root / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(Path(__file__).resolve().parents[2]), str(repo)],
                   check=True)
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "pr")
    edit(repo)
    git(repo, "commit", "-q", "-am", message)
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


# 2 gates at a loose rate (tests stay short). 5 A/A pairs would reach it (1/C(9,4) < 1.25e-2), but then each floor
# is the single most extreme A/A pair, and one outlier pair on a loaded CI box put a +100 % decode speedup
# inside it; with 9 the floors are the 2nd most extreme on each side (4 agreeing pairs, bound 7.0e-3), and the
# noise-ratio widening (it needs 2 pairs older than the newest 8) stays out of these tests of the tiers.
LOOSE = {"false_significance_rate": 0.05, "calibration_pairs_target": 9}


def eval_fakes(tmp_path, head=None, base=None, secrets=None, settings=None, calibrate=False, job=None, store=None,
               **prof):
    """One evaluation of fake runtimes. `calibrate`: first record A/A pairs of main (pairs only,
    worker/calibration/auto.py) under `settings` (give it a loose rate to keep the test short)."""
    repo = make_repo(tmp_path, head=head, base=base)
    defaults = dict(decode_contexts=[32], prefill_contexts=[64], pairs=2, warmup=0, inner=1, prompts_per_seed=1,
                    request_timeout_s=6)
    models = prof.pop("models", None)
    defaults.update(prof)
    profile = make_profile(fake_model(tmp_path / "m.gguf"))
    spec = profile.models[0].model_copy(update={k: defaults.pop(k) for k in ("decode_contexts", "prefill_contexts")})
    profile = profile.model_copy(update={"models": models or [spec], **defaults})
    s = make_settings(profile, **(settings or {}))
    store = store or AAStore(tmp_path / "aa.sqlite")
    if calibrate:
        from worker.calibration.auto import calibrate_pairs

        run = calibrate_pairs(str(repo), "main", s, store=store, trusted_root=GOOD)
        assert run.done, run
    return evaluate(job or Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"), s,
                    trusted_root=GOOD, store=store, secrets=secrets)


def reference_verify_stages(monkeypatch) -> list[str]:
    """The prompt keys the trusted reference is sent to compute in verify, in order (filled as the evaluation runs)."""
    from worker.harness.client import RevisionProcess

    staged, request = [], RevisionProcess.request

    def spy(self, op, **k):
        if self.role == "reference" and op == "stage" and k.get("phase") == "verify":
            staged.append(k["key"])
        return request(self, op, **k)

    monkeypatch.setattr(RevisionProcess, "request", spy)
    return staged


def quick_settings() -> EvalSettings:
    """The quick profile, on the shared tiny fixture GGUF where this checkout has no synthetic factory."""
    s = EvalSettings(profile="quick")
    quick = s.profile_settings("quick")
    try:
        import runtime.synth  # noqa: F401

        return s
    except ImportError:
        fixture = TINY / "qwen35-tiny4-Q4_K_M.gguf"
        if not fixture.exists():
            pytest.skip(f"no synthetic model factory and no fixture at {fixture}")
        primary = next(m for m in quick.models if m.role == "primary")
        spec = ModelSpec(name=primary.name, path=str(fixture), decode_contexts=primary.decode_contexts,
                         prefill_contexts=primary.prefill_contexts)
        return s.with_profile("quick", models=[spec])


@contextmanager
def loaded_fake(tmp_path: Path, role: str = "head"):
    """One sandboxed driver process of the good fake runtime, its model loaded on the CPU."""
    from worker.harness.client import RevisionProcess

    m = fake_model(tmp_path / "m.gguf")
    with RevisionProcess(role, GOOD, tmp_path / "w", read_only=[tmp_path]) as proc:
        proc.start(30)
        proc.request("load", path=str(m), device="cpu", max_context=512, backend="auto", phase="load", timeout=30)
        yield proc
