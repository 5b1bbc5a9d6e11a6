"""Every repository path the docs, the device scripts and the code's comments name exists.

The GPU scripts (bench/device/*.sh) run only on a lent machine, so a moved benchmark would otherwise be found
missing there, at the cost of device minutes."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH = re.compile(r"\b(?:bench|worker|runtime|bot|tests|scripts|templates|migrations)/[A-Za-z0-9_./-]+"
                  r"\.(?:py|sh|json|md|yml|toml|j2|sqlite)\b")
# Copied from outside (its paths are other projects' files) or receipts' own records of what ran then.
FOREIGN = {"docs/qwen35-architecture.md"}


def _sources():
    yield from [REPO / "README.md", REPO / ".ci" / "run", REPO / "docker-compose.yml"]
    yield from sorted((REPO / "docs").rglob("*.md"))
    yield from sorted((REPO / "bench" / "device").glob("*.sh"))
    for pkg in ("bench", "worker", "bot", "runtime", "scripts"):
        yield from sorted(p for p in (REPO / pkg).rglob("*.py") if "receipts" not in p.parts)


def test_named_paths_exist():
    missing = []
    for src in _sources():
        rel = src.relative_to(REPO).as_posix()
        if rel in FOREIGN or not src.is_file():
            continue
        for name in sorted(set(PATH.findall(src.read_text(errors="replace")))):
            if not (REPO / name).exists() and "*" not in name:
                missing.append(f"{rel}: {name}")
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)


def test_the_check_sees_a_missing_path():
    assert PATH.findall("run bench/worker/gone.py, then bench/device/pending.sh") == [
        "bench/worker/gone.py", "bench/device/pending.sh"]
