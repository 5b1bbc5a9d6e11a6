"""The head is measured as it would land (worker/checkout.py): a PR branched off an older main is merged with the
base it is measured against, so its "speedup" cannot come from lacking what main gained since (a hostile author
after a main regression: branch off before it, and every round sees a speedup that merging would not deliver)."""
import pytest

from worker.checkout import MergeConflict, checkout_pair, remove_worktree
from worker.pipeline import Job, evaluate
from worker.records import Verdict

from tests.worker.helpers import GOOD, fake_model, git, make_profile, make_repo, make_settings, overlay


def commit_file(repo, branch: str, name: str, text: str) -> str:
    git(repo, "checkout", "-q", branch)
    (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{branch}: {name}")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return sha


def test_a_head_branched_off_an_older_main_is_measured_merged_with_the_base(tmp_path, cache):
    repo = make_repo(tmp_path)
    head = commit_file(repo, "pr", "pr.txt", "the PR's change\n")
    base = commit_file(repo, "main", "main.txt", "landed on main after the PR branched off\n")
    git_dir, b, h = checkout_pair(str(repo), "main", "pr", tmp_path / "w1", base, head)
    try:
        assert (b.sha, h.sha) == (base, head)  # the verdict still names the PR's own head
        assert (h.root / "pr.txt").exists() and (h.root / "main.txt").exists()
        assert h.merged_sha not in (None, head) and h.measured_sha == h.merged_sha
        parents = git(h.root, "rev-list", "--parents", "-n", "1", h.merged_sha).split()[1:]
        assert parents == [head, base]
    finally:
        for rev in (b, h):
            remove_worktree(git_dir, rev)
    # the same pair gives the same commit: its compile cache is found again by the next evaluation of it
    git_dir, b2, h2 = checkout_pair(str(repo), "main", "pr", tmp_path / "w2", base, head)
    assert h2.merged_sha == h.merged_sha


def test_a_head_that_contains_its_base_is_measured_as_it_is(tmp_path, cache):
    repo = make_repo(tmp_path)
    head = commit_file(repo, "pr", "pr.txt", "x\n")
    _, _, h = checkout_pair(str(repo), "main", "pr", tmp_path / "w", None, head)
    assert h.merged_sha is None and h.measured_sha == head


@pytest.mark.sandbox
def test_a_head_that_does_not_merge_with_its_base_is_the_prs_failure_not_infra(tmp_path, cache):
    repo = make_repo(tmp_path)
    commit_file(repo, "pr", "runtime/NOTES", "the PR's version\n")
    commit_file(repo, "main", "runtime/NOTES", "main's version\n")
    with pytest.raises(MergeConflict, match="runtime/NOTES"):
        checkout_pair(str(repo), "main", "pr", tmp_path / "w")
    r = evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"),
                 make_settings(make_profile(fake_model(tmp_path / "m.gguf"))), trusted_root=GOOD)
    assert r.verdict is Verdict.BUILD_FAILED, r.summary  # shown as REJECT: a rebase fixes it, no retry does
    assert "does not merge cleanly" in r.summary and "rebase" in r.summary


@pytest.mark.sandbox
def test_a_speedup_that_is_only_the_lack_of_mains_later_regression_is_not_measured(tmp_path, cache):
    """main regresses decode 2x after the PR branched off; the PR changes nothing else. Measured as it would land,
    head and base run the same code: no speedup to claim."""
    repo = make_repo(tmp_path)
    head = commit_file(repo, "pr", "pr.txt", "a harmless change\n")
    overlay(repo, "slow_decode")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "main: a decode regression lands")
    profile = make_profile(fake_model(tmp_path / "m.gguf"), decode_contexts=[32], prefill_contexts=[],
                           pairs=2, warmup=0, inner=1, prompts_per_seed=1, request_timeout_s=6)
    profile = profile.model_copy(update={"models": [profile.models[0].model_copy(
        update={"decode_contexts": [32], "prefill_contexts": []})]})
    r = evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", head_sha=head, profile="test"),
                 make_settings(profile), trusted_root=GOOD)
    (decode,) = [g for g in r.gates if g.gate.startswith("decode")]
    # unmerged, the head ran the good runtime against main's 2x slower one: rel_change ~ +1.0
    assert abs(decode.rel_change) < 0.3, (decode.rel_change, r.summary)
    assert r.receipt["revisions"]["head"]["merged_with_base"], r.summary


def test_a_merge_the_host_cannot_make_is_infra_not_the_prs(tmp_path, cache, monkeypatch):
    """git failing for the host's reasons (a full disk, a broken object store) while merging: a CheckoutError,
    which the pipeline makes INFRA (retried), never the PR's BUILD_FAILED."""
    import subprocess

    from worker.checkout import CheckoutError
    repo = make_repo(tmp_path)
    head = commit_file(repo, "pr", "pr.txt", "x\n")
    base = commit_file(repo, "main", "main.txt", "y\n")
    real = subprocess.run

    def disk_full(args, *a, **k):
        if "merge-tree" in args:
            return subprocess.CompletedProcess(args, 128, "", "fatal: write error: No space left on device")
        return real(args, *a, **k)
    monkeypatch.setattr(subprocess, "run", disk_full)
    with pytest.raises(CheckoutError) as got:
        checkout_pair(str(repo), "main", "pr", tmp_path / "w", base, head)
    assert not isinstance(got.value, MergeConflict) and "No space left" in str(got.value)
