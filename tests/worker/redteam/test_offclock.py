"""Hostile revisions that move work off the parent's clock or blame the host for their own faults,
through the whole pipeline (tests/worker/redteam/conftest.py builds them)."""
import pytest

from worker.records import Verdict

from .test_evaluations import TIERS, text
from .conftest import run_eval

pytestmark = pytest.mark.timed  # whole evaluations: speed gates and request deadlines


def _gains_nothing(tmp_path, runtime: str) -> None:
    """No tier, and no gate's head median 1.5x base's: the work moved off the clock bought no speed."""
    r = run_eval(tmp_path, runtime)
    assert r.verdict not in TIERS, text(r)
    for g in r.gates:
        assert g.head_median < 1.5 * g.base_median, g


@pytest.mark.sandbox
def test_precomputing_staged_prompts_gains_nothing(tmp_path):
    """Every prompt was staged before timing: its answers computed in `stage`, replayed when timed (+400 % decode, +540 % prefill before)."""
    _gains_nothing(tmp_path, "precompute_stage")


@pytest.mark.sandbox
def test_decoding_ahead_off_the_clock_gains_nothing(tmp_path):
    """decode@32 has no prefill gate, so its prefill is untimed: the greedy continuation decoded inside it and in
    the gap after its answer, replayed in the timed generate (+267 % / +318 % decode before the generate brought a
    secret lead token to start from)."""
    _gains_nothing(tmp_path, "decode_ahead")


@pytest.mark.sandbox
def test_a_head_that_labels_its_crash_a_sandbox_fault_is_not_infra(tmp_path):
    """Its patched driver answers kind "sandbox" for its own exception (INFRA sandbox_failure before)."""
    r = run_eval(tmp_path, "forge_fault")
    assert r.verdict is Verdict.BUILD_FAILED, text(r)
    assert "'sandbox'" in r.summary and "only the worker" in r.summary, text(r)


@pytest.mark.sandbox
def test_forged_fields_in_the_drivers_answers_are_the_prs_fault(tmp_path):
    """Its hello and answers carry the worker's own fields as non-dicts, a megabyte of version text and a vocabulary
    size as a string: the harness tripped over them (TypeError: INFRA, retried) before."""
    r = run_eval(tmp_path, "forge_hello")
    assert r.verdict is Verdict.BUILD_FAILED and r.infra_kind is None, text(r)
    assert "vocab_size" in r.summary, text(r)
    assert len(text(r)) < 50_000, "the forged megabyte reached the report"


@pytest.mark.sandbox
def test_a_forged_memory_report_is_neither_infra_nor_kept_whole(tmp_path):
    """The revision's own memory report (the memory gates use NVML's, not this) came back without its memory: a
    KeyError in the harness, INFRA internal_error, before."""
    r = run_eval(tmp_path, "forge_memory")
    assert r.verdict is not Verdict.INFRA, text(r)
    (model,) = r.receipt["models"].values()
    reported = model["memory_reported_by_revision"]
    assert reported["head"] is None and reported["base"] is not None, reported


@pytest.mark.sandbox
def test_nan_only_in_timed_prefills_is_the_prs_fault(tmp_path):
    """NaN logits only when not asked for all logits (the guards see clean ones): INFRA nan_metric before."""
    r = run_eval(tmp_path, "nan_when_timed")
    assert r.verdict is Verdict.REJECT and r.infra_kind is None, text(r)
    assert "non-finite" in r.summary and r.failure["attempts"] == 2, text(r)


@pytest.mark.sandbox
def test_printing_a_host_oom_and_exiting_137_is_the_prs_fault(tmp_path):
    """CUDA out-of-memory and bwrap text on stderr, then exit 137 mid-decode: no hole found (the OOM is judged
    by base's measured memory, not by the text), so REJECT after the confirming attempt."""
    r = run_eval(tmp_path, "fake_oom")
    assert r.verdict is Verdict.REJECT and r.infra_kind is None, text(r)
    assert r.failure["attempts"] == 2 and "base ran the same work" in text(r), text(r)
