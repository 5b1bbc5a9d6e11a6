"""Scripts stand on the project's own modules, never on the tests (shared helpers live in bot/testing/)."""
import ast
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_script_imports_the_tests():
    offenders = {p.name: sorted(m for m in imported_modules(p) if m == "tests" or m.startswith("tests."))
                 for p in SCRIPTS.glob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert "tests.bot" not in (SCRIPTS / "fault_drill.py").read_text()  # nor names them (--include modules)
