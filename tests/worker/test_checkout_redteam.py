"""Red-team tests of worker/checkout.py merged_commit / checkout_pair: a hostile PR against the merge the worker
makes before measuring (the head merged with the base). The line-ending and merge-attribute tests failed while
that merge ran in the head's worktree (session 19); it is now made as GitHub makes it, in the bare mirror."""
import os
import subprocess
import threading
import time

import pytest

from worker.checkout import CheckoutError, MergeConflict, checkout_pair, remove_worktree
from worker.pipeline import Job, evaluate
from worker.records import Verdict

from tests.worker.helpers import GOOD, fake_model, git, make_profile, make_repo, make_settings


def commit(repo, branch, files: dict, msg=None, remove=(), only=False):
    """Commit `files` (name -> text/bytes, or ('symlink', target)) on `branch`; back on main; the new sha."""
    git(repo, "checkout", "-q", branch)
    for name in remove:
        git(repo, "rm", "-q", "-r", name)
    for name, content in files.items():
        p = repo / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple) and content[0] == "symlink":
            if p.is_symlink() or p.exists():
                if p.is_dir() and not p.is_symlink():
                    import shutil
                    shutil.rmtree(p)
                else:
                    p.unlink()
            os.symlink(content[1], p)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    git(repo, "add", *(["--", *files] if only else ["-A"]))  # only: the named files, as `git add FILE` does
    git(repo, "commit", "-q", "--allow-empty", "-m", msg or f"{branch}: {sorted(files)}")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return sha


def github_merge_tree(git_dir, head, base):
    """What GitHub's server-side merge computes (merge-ort on the bare repository, no worktree): (rc, tree)."""
    p = subprocess.run(["git", "--git-dir", str(git_dir), "merge-tree", "--write-tree", head, base],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    return p.returncode, p.stdout.split("\n", 1)[0]


def tree_of(git_dir, sha):
    return git(git_dir, "rev-parse", f"{sha}^{{tree}}")


# -- 1. PR content that tries to run code / write outside during the merge ----------------------------------------

def test_attributes_naming_filter_merge_and_diff_drivers_run_nothing(tmp_path, cache):
    repo = make_repo(tmp_path)
    marker = tmp_path / "PWNED"
    evil = f"touch {marker}"
    # Drivers named by the PR; the PR also ships a config fragment hoping something includes it.
    head = commit(repo, "pr", {
        ".gitattributes": "* filter=evil merge=evil diff=evil\n",
        ".gitconfig": f"[filter \"evil\"]\n\tsmudge = {evil}\n\tclean = {evil}\n"
                      f"[merge \"evil\"]\n\tdriver = {evil}\n",
        ".lfsconfig": "[lfs]\n\turl = http://127.0.0.1:9/\n",
        "runtime/NOTES": "pr\n"})
    base = commit(repo, "main", {"main.txt": "main moved\n"})
    # (tests/worker/helpers.git runs with HOME=repo, so the setup itself read that .gitconfig: start clean)
    (repo / ".gitconfig").unlink(missing_ok=True)
    marker.unlink(missing_ok=True)
    git_dir, b, h = checkout_pair(str(repo), "main", "pr", tmp_path / "w", base, head)
    assert h.merged_sha and not marker.exists()
    for rev in (b, h):
        remove_worktree(git_dir, rev)


def test_a_symlinked_directory_in_the_head_does_not_let_the_bases_files_land_outside(tmp_path, cache):
    repo = make_repo(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    commit(repo, "main", {"plugins/a.py": "A = 1\n"}, msg="main: plugins/")  # both sides have plugins/
    git(repo, "branch", "-f", "pr", "main")
    head = commit(repo, "pr", {"plugins": ("symlink", str(outside))}, remove=["plugins"])
    base = commit(repo, "main", {"plugins/b.py": "B = 2\n", "plugins/a.py": "A = 3\n"})
    try:
        git_dir, b, h = checkout_pair(str(repo), "main", "pr", tmp_path / "w", base, head)
    except MergeConflict:
        pass
    assert list(outside.iterdir()) == []


def test_a_gitlink_and_gitmodules_are_not_fetched_during_the_merge(tmp_path, cache):
    repo = make_repo(tmp_path)
    marker = tmp_path / "sub-fetched"
    git(repo, "checkout", "-q", "pr")
    (repo / ".gitmodules").write_text(f'[submodule "x"]\n\tpath = x\n\turl = ext::sh -c "touch {marker}"\n')
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},x")
    git(repo, "add", ".gitmodules")
    git(repo, "commit", "-q", "-m", "submodule")
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    git(repo, "branch", "side", "main")
    commit(repo, "side", {"x": "a file where the head has a submodule\n"})
    base = commit(repo, "main", {"main.txt": "m\n"})
    git_dir, b, h = checkout_pair(str(repo), "main", "pr", tmp_path / "w", base, head)
    assert h.merged_sha and not marker.exists()
    # and where main changed the gitlink too (a submodule merge: ort looks in the submodule, never fetches it)
    git(repo, "checkout", "-q", "main")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{'2' * 40},x")
    git(repo, "commit", "-q", "-m", "main: gitlink")
    base2 = git(repo, "rev-parse", "HEAD")
    with pytest.raises((MergeConflict, CheckoutError)):
        checkout_pair(str(repo), "main", "pr", tmp_path / "w2", base2, head)
    assert not marker.exists()


# -- 2. What the worker merges vs what GitHub would merge -------------------------------------------------------

@pytest.mark.sandbox
def test_a_clean_merge_with_normalized_line_endings_is_not_reported_as_a_conflict(tmp_path, cache):
    """A repository with `* text` in .gitattributes and a file committed with CRLF before it (a very common state:
    attributes added without renormalizing). The head's fresh worktree is 'dirty' for git (CRLF on disk, the clean
    filter gives LF), so `git merge` refuses ('local changes would be overwritten') when main changed that file.
    GitHub merges it cleanly (no worktree); the worker says BUILD_FAILED 'does not merge cleanly', not retried."""
    repo = make_repo(tmp_path)
    commit(repo, "main", {"runtime/table.txt": b"a\r\nb\r\nc\r\n"}, msg="main: a CRLF data file")
    commit(repo, "main", {".gitattributes": "* text\n"}, msg="main: attributes", only=True)
    git(repo, "branch", "-f", "pr", "main")
    head = commit(repo, "pr", {"pr.txt": "an unrelated change\n"}, only=True)
    base = commit(repo, "main", {"runtime/table.txt": b"a\r\nb\r\nc\r\nd\r\n"}, msg="main: table grows")
    blob = subprocess.run(["git", "-C", str(repo), "cat-file", "-p", f"{head}:runtime/table.txt"], capture_output=True,
                          check=True).stdout
    assert blob == b"a\r\nb\r\nc\r\n"  # the head's blob: CRLF, as committed before the attributes

    from worker.checkout import mirror
    rc, _ = github_merge_tree(mirror(str(repo)), head, base)
    assert rc == 0  # merges cleanly where there is no worktree (GitHub's mergeability / squash)

    r = evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", base_sha=base, head_sha=head, profile="test"),
                 make_settings(make_profile(fake_model(tmp_path / "m.gguf"))), trusted_root=GOOD)
    assert r.verdict is not Verdict.BUILD_FAILED, r.summary


def test_the_heads_merge_attributes_do_not_turn_a_conflict_into_measured_code(tmp_path, cache):
    """The PR adds `merge=union` for a file main also changed. GitHub's server-side merge has no worktree and
    conflicts; the worker's `git merge` reads the head's worktree attributes and 'merges' both sides' lines, then
    measures code that can never land (a verdict on a PR GitHub shows as conflicting)."""
    repo = make_repo(tmp_path)
    head = commit(repo, "pr", {".gitattributes": "runtime/knob.py merge=union\n", "runtime/knob.py": "SPEED = 3\n"})
    base = commit(repo, "main", {"runtime/knob.py": "SPEED = 2\n"})
    from worker.checkout import mirror
    rc, _ = github_merge_tree(mirror(str(repo)), head, base)
    assert rc == 1  # a conflict for GitHub
    with pytest.raises(MergeConflict):
        checkout_pair(str(repo), "main", "pr", tmp_path / "w", base, head)


def test_the_merged_tree_is_the_tree_github_lands_for_the_squash_method(tmp_path, cache):
    repo = make_repo(tmp_path)
    head = commit(repo, "pr", {"runtime/a.py": "X = 1\n", "pr.txt": "p\n"})
    base = commit(repo, "main", {"runtime/b.py": "Y = 2\n"})
    git_dir, b, h = checkout_pair(str(repo), "main", "pr", tmp_path / "w", base, head)
    rc, tree = github_merge_tree(git_dir, head, base)
    assert rc == 0 and tree == tree_of(git_dir, h.merged_sha)  # squash / merge-commit land exactly this tree


def test_a_head_behind_its_base_is_measured_as_the_base(tmp_path, cache):
    repo = make_repo(tmp_path)
    old = git(repo, "rev-parse", "main")
    base = commit(repo, "main", {"main.txt": "m\n"})
    git_dir, b, h = checkout_pair(str(repo), "main", old, tmp_path / "w", base, old)
    assert tree_of(git_dir, h.measured_sha) == tree_of(git_dir, base)


def test_unrelated_histories_are_the_prs_state(tmp_path, cache):
    repo = make_repo(tmp_path)
    git(repo, "checkout", "-q", "--orphan", "orphan")
    git(repo, "commit", "-q", "-m", "orphan")
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-f", "main")
    with pytest.raises(MergeConflict, match="unrelated"):
        checkout_pair(str(repo), "main", "orphan", tmp_path / "w", None, head)


# -- 3. Compile cache keys -----------------------------------------------------------------------------------------

def test_merged_heads_never_share_a_compile_cache_key_with_other_code(tmp_path, cache):
    repo = make_repo(tmp_path)
    h1 = commit(repo, "pr", {"a.txt": "1\n"})
    git(repo, "branch", "pr2", "main")
    h2 = commit(repo, "pr2", {"a.txt": "2\n"})
    b1 = commit(repo, "main", {"m.txt": "1\n"})
    b2 = commit(repo, "main", {"m.txt": "2\n"})
    keys = {}
    for n, (hs, bs) in enumerate([(h1, b1), (h1, b2), (h2, b1), (h2, b2)]):
        git_dir, b, h = checkout_pair(str(repo), "main", hs, tmp_path / f"w{n}", bs, hs)
        keys[(hs, bs)] = (h.measured_sha, tree_of(git_dir, h.measured_sha))
        assert h.measured_sha not in (b.measured_sha, hs, bs)
    by_key = {}
    for k, (sha, tree) in keys.items():
        assert by_key.setdefault(sha, tree) == tree
    assert len({s for s, _ in keys.values()}) == 4


# -- 4. Concurrency in one mirror ----------------------------------------------------------------------------------

def test_concurrent_evaluations_merging_in_one_mirror_do_not_disturb_each_other(tmp_path, cache):
    repo = make_repo(tmp_path)
    heads = []
    for i in range(4):
        git(repo, "branch", f"pr{i}", "main")
        heads.append(commit(repo, f"pr{i}", {f"pr{i}.txt": f"{i}\n" * 2000}))
    base = commit(repo, "main", {"main.txt": "m\n"})
    checkout_pair(str(repo), "main", "main", tmp_path / "warm", base, base)  # mirror exists
    results, errors = {}, []

    def one(i, rounds=3):
        try:
            for k in range(rounds):
                git_dir, b, h = checkout_pair(str(repo), "main", f"pr{i}", tmp_path / f"w{i}-{k}", base, heads[i])
                assert (h.root / f"pr{i}.txt").exists() and (h.root / "main.txt").exists()
                results.setdefault(i, set()).add(h.merged_sha)
                time.sleep(0.05)
                assert git(h.root, "rev-parse", "HEAD") == h.merged_sha  # its worktree still there
                for rev in (b, h):
                    remove_worktree(git_dir, rev)
        except Exception as exc:  # noqa: BLE001
            errors.append((i, repr(exc)))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert all(len(v) == 1 for v in results.values()) and len(results) == 4


# -- 5. The conflict message in the comment --------------------------------------------------------------------------

@pytest.mark.sandbox
def test_conflicting_file_names_cannot_inject_markdown_mentions_or_hide_the_verdict(tmp_path, cache):
    from datetime import datetime, timezone

    from bot import render
    from bot.enums import EvalState

    repo = make_repo(tmp_path)
    name = "[x](https:/evil.example/p)@octocat<!--hide`#1.py"
    commit(repo, "pr", {name: "pr\n"})
    commit(repo, "main", {name: "main\n"})
    r = evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"),
                 make_settings(make_profile(fake_model(tmp_path / "m.gguf"))), trusted_root=GOOD)
    assert r.verdict is Verdict.BUILD_FAILED and "octocat" in r.summary, r.summary
    run = render.RunView(id=1, state=EvalState.DONE, head_sha=r.head_sha, base_sha=r.base_sha, base_ref="main",
                         attempt=1, max_attempts=3, profile="test", trigger="push", requested_by=None,
                         created_at=datetime.now(timezone.utc), duration_s=1.0, result=r)
    body = render.check_output(run)["summary"] + render.sticky_comment(
        current=run, earlier=[], awaiting_approval=False, approval_label="x", head_sha=r.head_sha, models=[])
    assert "<!--hide" not in body and "@octocat" not in body and "](https://" not in body
    assert str(cache) not in body and str(tmp_path) not in body  # no host paths
