"""Hostile revisions that move work off the parent's clock or blame the host for their own faults,
through the whole pipeline (tests/worker/redteam/conftest.py builds them)."""
import pytest

from .test_evaluations import TIERS, judged, text
from .conftest import run_eval

pytestmark = pytest.mark.timed  # whole evaluations: speed gates and request deadlines


def test_precomputing_staged_prompts_gains_nothing(tmp_path):
    """Every prompt was staged before timing: its answers computed in `stage`, replayed when timed (+400 % decode, +540 % prefill before)."""
    r = run_eval(tmp_path, "precompute_stage")
    if not judged(r):
        return
    assert r.verdict not in TIERS, text(r)
    for g in r.gates:
        assert g.head_median < 1.5 * g.base_median, g

