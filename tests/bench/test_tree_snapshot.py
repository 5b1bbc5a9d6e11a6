"""bench/tree_snapshot.py: revisions checked out by bench scripts are the working tree, not the last commit."""
import subprocess

from bench.tree_snapshot import REF, snapshot_commit, working_tree


def _git(repo, *a):
    return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo, message):
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)


def _repo(tmp_path, files: dict[str, str]):
    """A repository whose one commit holds `files`."""
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    for name, text in files.items():
        (repo / name).write_text(text)
    _commit(repo, "c1")
    return repo


def test_snapshot_holds_changed_and_untracked_files_and_leaves_head_alone(tmp_path):
    repo = _repo(tmp_path, {".gitignore": "*.gguf\n", "a.py": "old\n"})
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "a.py").write_text("new\n")
    (repo / "b.py").write_text("untracked\n")
    (repo / "m.gguf").write_text("ignored\n")
    sha = snapshot_commit(repo)
    assert sha != head and _git(repo, "rev-parse", REF) == sha
    assert _git(repo, "show", f"{sha}:a.py") == "new" and _git(repo, "show", f"{sha}:b.py") == "untracked"
    assert "m.gguf" not in _git(repo, "ls-tree", "--name-only", sha)
    assert _git(repo, "rev-parse", "HEAD") == head and _git(repo, "status", "--porcelain").count("??") == 1


def test_clean_tree_is_head(tmp_path):
    repo = _repo(tmp_path, {"a.py": "x\n"})
    assert snapshot_commit(repo) == _git(repo, "rev-parse", "HEAD")


def test_working_tree_names_the_code_that_ran_not_head(tmp_path):
    """On the device HEAD is the last landed commit; a receipt's git_tree must be the tree that ran, the same SHA as
    the local commit's tree that was sent."""
    from bench.tree_snapshot import working_tree

    repo = _repo(tmp_path, {"a.py": "old\n"})  # the landed commit
    assert working_tree(repo) == _git(repo, "rev-parse", "HEAD^{tree}")
    (repo / "a.py").write_text("new\n")  # the session's commit, sent as a working tree
    sent = working_tree(repo)
    assert sent != _git(repo, "rev-parse", "HEAD^{tree}") and _git(repo, "status", "--porcelain") == "M a.py"
    _commit(repo, "local")
    assert sent == _git(repo, "rev-parse", "HEAD^{tree}")


def test_receipts_record_the_tree_that_ran(monkeypatch):
    from bench.runtime.decode import ROOT, environment
    from bench.tree_snapshot import working_tree

    monkeypatch.delenv("TOKENGATE_COMMIT", raising=False)
    env = environment()
    assert env["git_tree"] == working_tree(ROOT)
    assert env["git_tree_is_head"] == (env["git_tree"] == _git(ROOT, "rev-parse", "HEAD^{tree}"))


def test_the_receipt_names_the_tree_that_ran_or_says_why_not(tmp_path):
    """On the device HEAD is the last landed commit, not what ran: receipts (bench/worker/gpu_e2e.py,
    bench/runtime/decode.py) name the working tree's SHA."""
    import re

    from bench.runtime.decode import ROOT
    from bench.tree_snapshot import tree_facts

    got = tree_facts(ROOT)
    assert re.fullmatch(r"[0-9a-f]{40}", got["git_tree"]) and got["git_tree"] == working_tree(ROOT)
    assert got["git_commit"] == (_git(ROOT, "rev-parse", "HEAD") if got["git_tree_is_head"] else None)
    got = tree_facts(tmp_path)  # no git here: null, with the reason
    assert got["git_tree"] is None and got["git_tree_reason"]


def test_the_commit_is_named_only_where_the_tree_that_ran_is_heads(tmp_path):
    from bench.tree_snapshot import tree_facts

    repo = _repo(tmp_path, {"a.py": "old\n"})
    assert tree_facts(repo)["git_commit"] == _git(repo, "rev-parse", "HEAD")
    (repo / "a.py").write_text("sent, not landed\n")  # what the device copy holds beside the last landed commit
    got = tree_facts(repo)
    assert got["git_commit"] is None and not got["git_tree_is_head"]
