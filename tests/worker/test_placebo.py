"""Placebo: identical revisions, evaluated over and over, must never be rejected."""
import json

import pytest

from worker.aa_store import AAStore
from worker.placebo import run_placebo

from .conftest import GOOD, fake_model, make_profile, make_repo, make_settings


@pytest.mark.slow
def test_placebo_aa_never_rejects(tmp_path, cache):
    repo = make_repo(tmp_path)
    profile = make_profile(fake_model(tmp_path / "m.gguf"), prompts_per_seed=1)
    rep = run_placebo(str(repo), "main", make_settings(profile), evaluations=20, calibrate=12, restart_every=2,
                      workdir=tmp_path / "w", store=AAStore(tmp_path / "aa.sqlite"), trusted_root=GOOD)
    print(json.dumps({"verdicts": rep.verdicts, "noise": rep.noise_table(),
                      "s_per_eval": rep.seconds_per_evaluation}, indent=1))
    assert sum(rep.verdicts.values()) == 20
    assert rep.false_rejects == 0, rep.verdicts
    assert all(len(d) == 32 for d in rep.deltas.values())
    assert all(f >= 0.02 for f in rep.floors.values())  # calibrated floors, never below the minimum
