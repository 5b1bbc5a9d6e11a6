"""The suite runs on two xdist workers; a `timed` test must have the machine to itself (tests/conftest.py).

A small suite of sleepers, run the way the test command runs ours, records when each test ran: a timed
one may overlap nothing, while the untimed ones do overlap (so the check can see overlap at all).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SLEEPERS = '''
import json, os, time
import pytest

def _ran(name):
    t0 = time.monotonic(); time.sleep(0.5); t1 = time.monotonic()
    with open(os.environ["TIMED_LOG"], "a") as f:
        f.write(json.dumps([name, t0, t1]) + "\\n")

@pytest.mark.timed
def test_timed_a(): _ran("timed")

@pytest.mark.timed
def test_timed_b(): _ran("timed")

@pytest.mark.parametrize("i", range(8))
def test_untimed(i): _ran("untimed")
'''


def _overlap(a, b) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def _pytest(folder, conftest_import: str, tests: str, *args, **env):
    """Run `tests` (one module) in `folder` under the named piece of this suite's conftest."""
    (folder / "conftest.py").write_text(f"from tests.conftest import {conftest_import}  # noqa: F401\n")
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    timed: runs alone\n    sandbox: needs the sandbox\n")
    (folder / "test_module.py").write_text(tests)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(folder)],
                          cwd=folder, env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True,
                          text=True, timeout=120)


def test_timed_tests_overlap_nothing_under_xdist(tmp_path):
    pytest.importorskip("xdist")
    log = tmp_path / "log.jsonl"
    r = _pytest(tmp_path, "pytest_runtest_protocol", SLEEPERS, "-n", "2", TIMED_LOG=str(log))
    assert r.returncode == 0, r.stdout + r.stderr
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 10
    timed = [x for x in runs if x[0] == "timed"]
    untimed = [x for x in runs if x[0] == "untimed"]
    assert any(_overlap(a, b) for a in untimed for b in untimed if a is not b), "the two workers never overlapped"
    clashes = [(t, o) for t in timed for o in runs if o is not t and _overlap(t, o)]
    assert not clashes, clashes


STARTER = '''
import pytest
from worker.harness.client import RevisionProcess

def _start(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(OSError):  # the workdir is a file: start() stops before anything runs
        RevisionProcess("head", tmp_path, tmp_path / "afile").start(timeout=1)

def test_unmarked(tmp_path): _start(tmp_path)

@pytest.mark.timed
@pytest.mark.sandbox
def test_marked(tmp_path): _start(tmp_path)

@pytest.mark.timed
def test_timed_only(tmp_path): _start(tmp_path)
'''


def test_a_test_that_starts_revisions_must_be_marked_timed_and_sandbox(tmp_path):
    r = _pytest(tmp_path, "_revisions_are_marked", STARTER, "-rA")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "PASSED test_module.py::test_marked" in out, out
    assert "ERROR test_module.py::test_unmarked" in out and "not marked @pytest.mark.timed" in out, out
    assert "ERROR test_module.py::test_timed_only" in out and "not marked @pytest.mark.sandbox" in out, out


def test_a_sandbox_test_skips_where_the_sandbox_is_missing_and_fails_where_it_is_required(tmp_path):
    """A machine without bubblewrap runs the README's test command green, saying what it did not test; CI
    (`.ci/run`, TOKENGATE_REQUIRE_SANDBOX=1) fails instead: a missing sandbox never passes as skipped tests there."""
    (tmp_path / "conftest.py").write_text(
        "import tests.conftest as suite\n"
        "suite.sandbox_missing = lambda: 'bubblewrap is not installed (as if)'\n"
        "from tests.conftest import pytest_runtest_setup  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    sandbox: needs it\n    services: needs them\n")
    (tmp_path / "test_module.py").write_text("import pytest\n\n@pytest.mark.sandbox\ndef test_escape(): pass\n")
    run = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TOKENGATE_REQUIRE_SANDBOX", None)
    fresh = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0 and "SKIPPED" in fresh.stdout and "bubblewrap is not installed (as if)" in fresh.stdout, (
        fresh.stdout + fresh.stderr)
    ci = subprocess.run(run, cwd=tmp_path, env={**env, "TOKENGATE_REQUIRE_SANDBOX": "1"}, capture_output=True,
                        text=True, timeout=120)
    assert ci.returncode == 1 and "failed, not skipped" in ci.stdout, ci.stdout + ci.stderr
