"""The GPU end-to-end run's planted branches (bench/worker/gpu_e2e.py) are built from main's text: each
plant must still find its line once, and every planted file must still be Python, or the device call
that runs them fails after minutes of setup (the decode plant had gone stale when the FFN moved)."""
import subprocess

from bench.worker.gpu_e2e import CASES, make_planted_repo

PLANTED = {"decode-slow": "runtime/triton/decode.py", "slow-base": "runtime/triton/decode.py",
           "prefill-slow": "runtime/triton/prefill.py", "accuracy-drift": "runtime/triton/engine.py"}


def git(repo, *a):
    return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout


def test_every_planted_branch_changes_only_its_file_and_still_compiles(tmp_path):
    repo = make_planted_repo(tmp_path)
    branches = {b.strip("* ").strip() for b in git(repo, "branch").splitlines()}
    assert {base for base, _, _ in CASES.values()} | {head for _, head, _ in CASES.values()} <= branches
    for branch, path in PLANTED.items():
        assert git(repo, "diff", "--name-only", "main", branch).split() == [path], branch
        source = git(repo, "show", f"{branch}:{path}")
        compile(source, f"{branch}:{path}", "exec")  # a SyntaxError here is a plant that broke the file
        assert "planted" in source
