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

from worker.calibration.aa_store import AAStore
from worker.calibration.placebo import run_placebo
from tests.worker.helpers import quick_settings

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.sandbox
@pytest.mark.slow
def test_placebo_quick_profile_never_rejects(tmp_path, cache):
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(repo)], check=True)
    settings = quick_settings()
    # Up to 6 agreeing process pairs (the `standard` profile's design) instead of quick's 4: the least history
    # that reaches the default rate (1e-3 per evaluation, 4 gates, two sides) is then 10 pairs, not 19
    # (720 / (11·…·16) = 1.2e-4 per side per gate), which took ~70 s of CI's 2-core box. The calibration, the
    # floors and the judging are the same code; `python scripts/placebo_power.py cpu-placebo` runs the shipped
    # quick profile (19 pairs, 20 evaluations) for the receipt.
    settings = settings.with_profile("quick", max_process_pairs=6)
    from worker.gates.noise import history_needed

    calib = history_needed(settings.false_significance_rate / 4 / 2, settings.profile_settings().max_process_pairs)
    assert calib == 10
    runs = 3
    rep = run_placebo(str(repo), "HEAD", settings, evaluations=runs, calibrate=calib,
                      workdir=tmp_path / "w", store=AAStore(tmp_path / "aa.sqlite"), trusted_root=REPO)
    print(json.dumps({"verdicts": rep.verdicts, "noise": rep.noise_table(), "process_pairs": rep.process_pairs,
                      "s_per_eval": rep.seconds_per_evaluation}, indent=1))
    assert sum(rep.verdicts.values()) == runs
    assert all(b is not None for b in rep.bounds.values()), rep.bounds  # calibrated: the bound is claimed
    assert sum(rep.bounds.values()) <= settings.false_significance_rate
    assert rep.false_rejects == 0, rep.verdicts
    # Tiers share the bound (either side): P(any false tier in 3) <= 3 * 1e-3 = 0.3%;
    # one is tolerated so a CI run fails only on a pattern, while any false REJECT fails it.
    assert rep.false_tiers <= 1, rep.verdicts
    assert all(len(d) >= calib + runs for d in rep.deltas.values())  # one pair per run at least
    assert all(f > 0 for f in rep.floors.values())
