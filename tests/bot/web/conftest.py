from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest

from bot.db.engine import session_scope
from bot.testing.fake_evaluation import result_for
from tests.bot.web import fill

MAIN_POINTS = 7  # stand-in main measurements of qwen35-tiny decode@512 (speedups below)
SPEEDUPS = [0.01, -0.004, 0.02, 0.0, -0.01, 0.015, 0.005]


@pytest.fixture(scope="session")
def real_results(tmp_path_factory):
    """Two evaluations by the real pipeline: an unchanged head, and a head whose decode is slower."""
    root = tmp_path_factory.mktemp("real-evals")
    return {"none": fill.real_result(root / "none", None), "slow": fill.real_result(root / "slow", "slow_decode")}


@dataclass
class Filled:
    repo_name: str
    eval_ids: dict[str, int]
    main_ids: list[int]
    results: dict


@pytest.fixture
def filled(settings, github, remote, real_results) -> Filled:
    with session_scope() as session:
        repo = fill.repository(session, github, remote)
        ids = {}
        for number, (key, result) in enumerate(real_results.items(), start=10):
            ids[key] = fill.pr_evaluation(session, settings, repo, number, result, title=f"real {key}").id
        win = result_for("xl", repo=repo.full_name, pr=20, base_sha="a" * 40, head_sha="b" * 40, speedup=0.25)
        ids["xl"] = fill.pr_evaluation(session, settings, repo, 20, win, author="speedy", title="faster decode").id
        mains = []
        for i, rel in enumerate(SPEEDUPS):
            r = result_for("none", repo=repo.full_name, pr=None, base_sha=f"{i:040x}", head_sha=f"{i + 1:040x}")
            r.gates[0].head_median = 410.0 * (1 + rel)
            mains.append(fill.main(session, repo, r).id)
        return Filled(repo.full_name, ids, mains, real_results)


def receipt_median(result, gate: str, role: str = "head") -> float:
    samples = result.receipt["models"]["fake"]["samples_tok_s"][f"{role}/{gate}"]
    return statistics.median([x for pair in samples for x in pair])
