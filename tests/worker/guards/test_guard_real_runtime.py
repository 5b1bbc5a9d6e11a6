"""The real tiny runtime on the CPU profile: a PR that scales every logit (a temperature bug) keeps
every argmax, so top-1 cannot see it; the KL paired against base on the same prompts must REJECT it."""
from pathlib import Path

import pytest

from worker.calibration.aa_store import AAStore
from worker.pipeline import Job, evaluate
from worker.records import Verdict

from tests.worker.helpers import clone_with_pr
from tests.worker.helpers import quick_settings

REPO = Path(__file__).resolve().parents[3]
KL_DRIFT_PATCH = '''

# --- test PR: every logit scaled by 0.8 (argmax unchanged, KL to the reference up several-fold) ---
_t_prefill, _t_decode = ReferenceEngine.prefill, ReferenceEngine.decode
ReferenceEngine.prefill = lambda self, ids, *, all_logits=False: _t_prefill(self, ids, all_logits=all_logits) * 0.8
ReferenceEngine.decode = lambda self, t: _t_decode(self, t) * 0.8
'''


@pytest.mark.sandbox
def test_real_runtime_kl_drift_is_rejected(tmp_path, cache):
    def scale_logits(repo):
        engine = repo / "runtime" / "engine.py"
        engine.write_text(engine.read_text() + KL_DRIFT_PATCH)

    repo, base = clone_with_pr(tmp_path, scale_logits, "scale logits")
    s = quick_settings()
    quick = s.profile_settings("quick")
    # guards only (the accuracy path is what is under test; the gates would only cost time)
    models = [m.model_copy(update={"decode_contexts": [], "prefill_contexts": []}) for m in quick.models]
    s = s.with_profile("quick", models=models, prompts_per_seed=1)
    r = evaluate(Job(repo=str(repo), base_ref=base, head_ref="pr", profile="quick"), s,
                 trusted_root=REPO, store=AAStore(tmp_path / "aa.sqlite"))
    assert r.verdict is Verdict.REJECT, r.summary
    assert all(not g.passed and g.head_top1 == g.base_top1 for g in r.guards), r.guards
    assert all("base's" in g.reason for g in r.guards)
