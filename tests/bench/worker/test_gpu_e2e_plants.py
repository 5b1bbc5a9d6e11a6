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


def test_every_cases_head_contains_its_base_and_the_fix_is_mains_code_again(tmp_path):
    """The worker measures a head merged with its base where it does not contain it (worker/checkout.py): a case
    whose head lacks its base would be measured as something else (the speedup case as slow-base itself)."""
    repo = make_planted_repo(tmp_path)
    for base, head, _ in CASES.values():
        assert subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", base, head]).returncode == 0, \
            (base, head)
    assert git(repo, "rev-parse", "speed-fix:runtime") == git(repo, "rev-parse", "main:runtime")


def test_main_of_the_planted_repo_has_the_runtime_tree_calibration_measured(tmp_path, monkeypatch):
    """bench/worker/gpu_calibration.py calibrates the box on the working-tree snapshot: e2e's main must carry
    the very same runtime tree, or the worker first records A/A pairs of a 'changed' runtime (minutes). An
    ignored file under runtime/ (a local model) must not get into it."""
    from bench import tree_snapshot
    from bench.worker import gpu_e2e

    here = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(gpu_e2e.REPO), str(here)], check=True)
    (here / "runtime" / "local-model.gguf").write_bytes(b"GGUF ignored by .gitignore")
    monkeypatch.setattr(gpu_e2e, "REPO", here)
    repo = make_planted_repo(tmp_path / "e2e")
    snap = tree_snapshot.snapshot_commit(here)
    assert git(repo, "rev-parse", "main:runtime") == git(here, "rev-parse", f"{snap}:runtime")
    assert make_planted_repo(tmp_path / "e2e") == repo  # kept for a resumed run


def test_a_resumed_run_keeps_the_verdicts_it_has_and_reruns_what_was_cut_off(tmp_path):
    import json

    import pytest

    from bench.worker.gpu_e2e import resume

    host = {"gpu": {"uuid": "GPU-1", "memory_used": 5}}
    prior = {"profile": "standard", "host": {"gpu": {"uuid": "GPU-1", "memory_used": 9}}, "created": "t0",
             "steps": {"models": {}}, "wall_s": 500,
             "cases": [{"case": "aa", "verdict": "none", "ok": True}, {"case": "decode_slow", "verdict": None}]}
    path = tmp_path / "gpu-e2e.json"
    path.write_text(json.dumps(prior))
    receipt = {"host": host, "cases": [], "skipped": []}
    assert resume(receipt, path, "standard") == {"aa"}
    assert [c["case"] for c in receipt["cases"]] == ["aa"] and receipt["cut_off"][0]["case"] == "decode_slow"
    assert receipt["earlier_pieces"][0]["wall_s"] == 500
    with pytest.raises(SystemExit, match="another profile or GPU"):
        resume({"host": {"gpu": {"uuid": "GPU-2"}}, "cases": []}, path, "standard")
    assert resume({"host": host, "cases": []}, tmp_path / "none.json", "standard") == set()
