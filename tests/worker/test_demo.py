"""`tokengate demo`'s throwaway repository: a base and a PR branch with a real decode slowdown."""
import subprocess
import sys

from worker.cli import DEMO_SLOWER_PATCH, make_demo_repo


def test_demo_repo_has_a_pr_branch_with_a_real_change(tmp_path):
    repo, base, head = make_demo_repo(tmp_path)
    log = subprocess.run(["git", "-C", str(repo), "log", "--format=%s", f"{base}..{head}"], capture_output=True,
                         text=True, check=True).stdout
    assert "decode does its work twice" in log
    diff = subprocess.run(["git", "-C", str(repo), "diff", base, head, "--stat"], capture_output=True, text=True,
                          check=True).stdout
    assert "runtime/engine.py" in diff and "1 file changed" in diff
    assert (repo / "runtime" / "engine.py").read_text().endswith(DEMO_SLOWER_PATCH)
    # The PR's runtime imports and still satisfies the protocol's semantics (outputs unchanged).
    code = ("import torch, runtime.engine as e\n"
            "from runtime.models.random_weights import random_weights, small_config\n"
            "cfg = small_config(); w = random_weights(cfg, 0)\n"
            "a = e.ReferenceEngine.from_tensors(cfg, w, max_context=64)\n"
            "a.prefill([1, 2, 3]); x = a.decode(4)\n"
            "b = e.ReferenceEngine.from_tensors(cfg, w, max_context=64)\n"
            "b.prefill([1, 2, 3]); b.snapshot(); y = e._demo_fast_decode(b, 4)\n"
            "assert torch.equal(x, y) and a.position == b.position == 4\n")
    subprocess.run([sys.executable, "-c", code], cwd=repo, check=True, timeout=120)


def _result(verdict, gates=()):
    from worker.records import EvalResult, GateResult
    return EvalResult(repo="r", pr_number=None, base_sha="b", head_sha="h", profile="quick", verdict=verdict,
                      summary="s", gates=[GateResult("tiny", g, "decode_tok_s", 1.0, 0.5, -0.5, None, None, 0.05,
                                                     True, True) for g in gates])


def test_demo_succeeds_only_when_the_planted_decode_slowdown_is_rejected():
    from worker.cli import demo_outcome
    from worker.records import Verdict
    assert demo_outcome(_result(Verdict.REJECT, ["decode@32"]))[0]
    # Anything else is the demo failing at its job, and it says so.
    for bad in (_result(Verdict.REJECT, ["prefill@32"]), _result(Verdict.REJECT), _result(Verdict.NONE),
                _result(Verdict.INFRA), _result(Verdict.L)):
        ok, why = demo_outcome(bad)
        assert not ok and why


def test_the_demo_runs_its_own_branch_on_a_host_without_the_full_sandbox_and_says_so(monkeypatch):
    """A fresh machine often lacks bubblewrap: the quick start's demo must still show its REJECT. Its revisions are
    this package's own throwaway branch, so it runs them under the layers that work, printing why; where the full
    sandbox works it never takes the override (a PR's evaluation never does: INFRA sandbox_unavailable)."""
    import argparse
    import io

    from rich.console import Console

    from worker import cli, sandbox
    from worker.sandbox.probe import Isolation
    args = argparse.Namespace(profile="quick", retries=None)
    out = io.StringIO()
    monkeypatch.setattr(sandbox, "detect_isolation",
                        lambda: Isolation("degraded: cgroup", False, reason="bubblewrap is not installed"))
    assert cli._demo_settings(args, Console(file=out, width=200)).sandbox_dev_override
    assert "lacks the full sandbox (bubblewrap is not installed)" in out.getvalue()
    assert not cli._settings(args).sandbox_dev_override  # `tokengate eval` of a PR: never
    monkeypatch.setattr(sandbox, "detect_isolation", lambda: Isolation("bwrap+seccomp+cgroup", True, full=True))
    out = io.StringIO()
    assert not cli._demo_settings(args, Console(file=out, width=200)).sandbox_dev_override
    assert out.getvalue() == ""
