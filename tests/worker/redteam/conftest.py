"""Red-team fixtures: hostile revisions of the fake runtime, evaluated through the real pipeline.

Each hostile runtime lives in runtimes/<attack>/runtime/ and is laid over the good fake runtime on
the PR branch, with `_common/runtime/_attacks.py` (the attack helpers) and a `_target.json` the test
writes (ports, paths, markers of the host resources it must not reach).

If this host cannot build the full sandbox the suite says so loudly: the attacks (marked `sandbox`) skip, or FAIL
under TOKENGATE_REQUIRE_SANDBOX=1 as `.ci/run` runs them; they never pass there. That an evaluation is then INFRA
sandbox_unavailable is test_evaluations.py's `test_without_the_full_sandbox_the_evaluation_is_infra`.
"""
from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

from worker import sandbox
from worker.calibration.aa_store import AAStore
from worker.pipeline import Job, evaluate

from tests.worker.helpers import GOOD, fake_model, git, make_profile, make_settings

RUNTIMES = Path(__file__).parent / "runtimes"
ISO = sandbox.detect_isolation()
FULL = ISO.full


def pytest_report_header(config):
    if FULL:
        return f"red-team: full sandbox on this host ({ISO.method}; {ISO.facts.get('bwrap')})"
    return (f"red-team: *** THIS HOST CANNOT BUILD THE FULL SANDBOX *** ({ISO.reason}); attacks will "
            "skip (FAIL under TOKENGATE_REQUIRE_SANDBOX=1)")


if not FULL:
    warnings.warn(f"red-team suite: full sandbox unavailable here: {ISO.reason}", stacklevel=1)


def hostile_repo(root: Path, attack: str, target: dict | None = None) -> Path:
    repo = root / "repo"
    shutil.copytree(GOOD, repo, ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "pr")
    # the good runtime's hooks (its _variant.py), for the hostile one laid over it to import those it keeps
    shutil.copy(repo / "runtime" / "_variant.py", repo / "runtime" / "_honest.py")
    for part in ("_common", attack):
        shutil.copytree(RUNTIMES / part, repo, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "runtime" / "_target.json").write_text(json.dumps(target or {}))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"head: {attack}")
    git(repo, "checkout", "-q", "main")
    return repo


def run_eval(tmp_path: Path, attack: str, target: dict | None = None, *, settings_kw=None, **prof):
    repo = hostile_repo(tmp_path, attack, target)
    defaults = dict(pairs=3, warmup=0, inner=1, prompts_per_seed=1, request_timeout_s=20, load_timeout_s=30)
    ctx = {"decode_contexts": prof.pop("decode_contexts", [32]), "prefill_contexts": prof.pop("prefill_contexts", [64])}
    defaults.update(prof)
    profile = make_profile(fake_model(tmp_path / "m.gguf"))
    spec = profile.models[0].model_copy(update=ctx)
    profile = profile.model_copy(update={"models": [spec], **defaults})
    return evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"),
                    make_settings(profile, **(settings_kw or {})), trusted_root=GOOD,
                    store=AAStore(tmp_path / "aa.sqlite"))


def run_inside(tmp_path: Path, code: str, *, timeout: float = 60, **spec_kw):
    """Run a Python snippet in the full sandbox (what a revision gets); returns (rc, stderr, cgroup facts)."""
    import subprocess

    spec = sandbox.SandboxSpec(scratch=tmp_path / "scratch",
                               read_only=[Path(sys.prefix), Path(sys.base_prefix), *spec_kw.pop("read_only", [])],
                               **spec_kw)
    log = tmp_path / f"log-{len(list(tmp_path.glob('log-*')))}"
    p = sandbox.spawn([sys.executable, "-I", "-c", code], spec, log_path=log)
    p.stdin.close()
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        sandbox.kill_tree(p)
        rc = p.wait()
    facts = {}
    if p.cgroup is not None:
        facts = {"oom_kills": p.cgroup.oom_killed(), "pids_hits": p.cgroup.pids_limit_hits(),
                 "cpu_ns": p.cgroup.cpu_usage_ns(), "limits": p.cgroup.limits()}
        p.cgroup.close()
    return rc, log.read_text(errors="replace"), facts


def assert_postgres_untouched(marker: str) -> None:
    """No session under `marker`'s application name and no table named `marker` in the real PostgreSQL."""
    import psycopg2

    c = psycopg2.connect(host="127.0.0.1", user="postgres", dbname="postgres")
    try:
        cur = c.cursor()
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (marker,))
        assert cur.fetchone()[0] == 0
        cur.execute("SELECT to_regclass(%s)", (marker,))
        assert cur.fetchone()[0] is None
    finally:
        c.close()
