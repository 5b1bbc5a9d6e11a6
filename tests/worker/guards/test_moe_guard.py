"""The cross-architecture guard: `qwen35moe` (routed + shared experts) beside the dense models.

A PR that breaks only the MoE path (the top-k router weights no longer renormalised, a classic MoE
bug) leaves every dense model bit-identical, so only an MoE guard can see it."""
from pathlib import Path

import pytest

from runtime.config import MOE_ARCH, SHAPES
from worker.calibration.aa_store import AAStore
from worker.config import DEFAULT_PROFILES, ModelSpec
from worker.pipeline import Job, evaluate
from worker.records import Verdict

from tests.worker.helpers import clone_with_pr
from tests.worker.helpers import quick_settings

REPO = Path(__file__).resolve().parents[3]
UNNORMALISED = ("    return top / top.sum(-1, keepdim=True), ids\n",
                "    return top, ids  # test PR: no renormalisation\n")


def test_full_profile_guards_with_the_moe_sibling():
    shapes = {m.synth["shape"] for m in DEFAULT_PROFILES["full"].models if m.synth}
    assert any(SHAPES[s].is_moe for s in shapes), shapes
    assert MOE_ARCH == "qwen35moe"


@pytest.mark.sandbox
def test_moe_only_bug_is_rejected_by_the_moe_guard(tmp_path, cache):
    def unnormalise(repo):
        ref = repo / "runtime" / "models" / "moe_ref.py"
        text = ref.read_text()
        assert text.count(UNNORMALISED[0]) == 1
        ref.write_text(text.replace(*UNNORMALISED))

    repo, base = clone_with_pr(tmp_path, unnormalise, "moe: drop top-k renormalisation")
    s = quick_settings()
    quick = s.profile_settings("quick")
    dense = next(m for m in quick.models if m.role == "primary")
    # guards only (the accuracy path is under test): the dense primary and a tiny MoE guard
    models = [dense.model_copy(update={"decode_contexts": [], "prefill_contexts": []}),
              ModelSpec(name="qwen35-tiny-moe", role="guard", synth={"shape": "tiny-moe", "quant": "q8_0", "seed": 3})]
    s = s.with_profile("quick", models=models, prompts_per_seed=1)
    r = evaluate(Job(repo=str(repo), base_ref=base, head_ref="pr", profile="quick"), s,
                 trusted_root=REPO, store=AAStore(tmp_path / "aa.sqlite"))
    by_model = {g.model: g for g in r.guards}
    assert r.verdict is Verdict.REJECT, r.summary
    assert by_model[dense.name].passed and by_model[dense.name].bit_identical, by_model[dense.name]
    moe = by_model["qwen35-tiny-moe"]
    assert not moe.passed and not moe.bit_identical and moe.head_kl > moe.base_kl, moe
