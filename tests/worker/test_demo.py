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
