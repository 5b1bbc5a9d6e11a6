"""scripts/mutation_check.py: its table stays true to the code (every edit applies exactly once, every test it
names exists), and its runner tells a killed mutant from one that survives. The full run (every rule, about
3 min) is the script's receipt, bench/receipts/mutation-check-*.json."""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "scripts" / "mutation_check.py")
mc = sys.modules["mutation_check"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
spec.loader.exec_module(mc)


def test_every_edit_applies_once_and_every_named_test_exists():
    assert len({m.id for m in mc.MUTATIONS}) == len(mc.MUTATIONS)
    for m in mc.MUTATIONS:
        for path, old, new in m.edits:
            assert (ROOT / path).read_text().count(old) == 1, (m.id, path, old)
            assert old != new, m.id
        for node in m.tests:
            file, _, name = node.partition("::")
            assert re.search(rf"^def {re.escape(name.split('[')[0])}\(", (ROOT / file).read_text(), re.M), (m.id, node)


@pytest.mark.timed  # it runs tests (one of them an evaluation) in subprocesses
def test_the_runner_tells_killed_from_survived(tmp_path):
    tree = tmp_path / "tree"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(tree)], check=True)
    for rel in ("scripts/mutation_check.py", "tests/test_mutation_check.py"):  # the working tree's, if uncommitted
        shutil.copy(ROOT / rel, tree / rel)
    (cache_key,) = [m for m in mc.MUTATIONS if m.id == "cache-key-includes-base"]
    harmless = mc.Mutation("harmless", "-", "a comment changes", (("worker/queue/tasks.py", "# Base too:", "# base:"),),
                           cache_key.tests)
    out = mc.check((cache_key, harmless), tree, timeout=120, log=lambda *_: None)
    assert [r["outcome"] for r in out["mutations"]] == ["killed", "survived"], out
    assert out["counts"] == {"killed": 1, "survived": 1, "error": 0, "stale": 0}
    assert out["mutations"][0]["killed_by"] and set(out["mutations"][0]["killed_by"]) <= set(cache_key.tests), out
    stale = mc.Mutation("stale", "-", "-", (("worker/queue/tasks.py", "no such text", ""),), cache_key.tests)
    assert mc.check_one(tree, stale, 60)["outcome"] == "stale"
    assert (tree / "worker/queue/tasks.py").read_text() == (ROOT / "worker/queue/tasks.py").read_text()  # restored
