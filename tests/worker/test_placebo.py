"""Placebo: identical revisions, evaluated over and over, must never be rejected.

Runs the quick profile (its gates, pairs, clock, guards) on the real reference engine of this
checkout. The tiny model is the quick profile's synthetic one when the runtime's factory is
available, else the shared tiny fixture GGUF.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from worker.aa_store import AAStore
from worker.config import EvalSettings, ModelSpec
from worker.placebo import run_placebo

REPO = Path(__file__).resolve().parents[2]


def quick_settings() -> EvalSettings:
    s = EvalSettings(profile="quick")
    quick = s.profile_settings("quick")
    try:
        import runtime.synth  # noqa: F401

        return s
    except ImportError:
        fixture = Path(os.environ["TOKENGATE_SHARED"]) / "fixtures" / "qwen35-tiny" / "qwen35-tiny4-Q4_K_M.gguf"
        if not fixture.exists():
            pytest.skip(f"no synthetic model factory and no fixture at {fixture}")
        primary = next(m for m in quick.models if m.role == "primary")
        spec = ModelSpec(name=primary.name, path=str(fixture), decode_contexts=primary.decode_contexts,
                         prefill_contexts=primary.prefill_contexts)
        return s.model_copy(update={"profiles": {**s.profiles, "quick": quick.model_copy(update={"models": [spec]})}})


@pytest.mark.slow
def test_placebo_quick_profile_never_rejects(tmp_path, cache):
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(repo)], check=True)
    # 20 A/A calibrations: with 10, the Q3 + 3·IQR floor missed the tail of this box's process-to-process
    # offsets (2 false REJECTs in one CI run).
    rep = run_placebo(str(repo), "HEAD", quick_settings(), evaluations=20, calibrate=20,
                      workdir=tmp_path / "w", store=AAStore(tmp_path / "aa.sqlite"), trusted_root=REPO)
    print(json.dumps({"verdicts": rep.verdicts, "noise": rep.noise_table(),
                      "s_per_eval": rep.seconds_per_evaluation}, indent=1))
    assert sum(rep.verdicts.values()) == 20
    assert rep.false_rejects == 0, rep.verdicts
    false_tiers = sum(v for k, v in rep.verdicts.items() if k in ("S", "M", "L", "XL"))
    assert false_tiers <= 2, rep.verdicts  # reported; a tier on A/A would be merged by merge-first
    assert all(len(d) == 40 for d in rep.deltas.values())
    assert all(f >= 0.02 for f in rep.floors.values())  # calibrated floors, never below the minimum
