"""CPU-side logic of bench/worker/sandbox_gpu_check.py (the GPU receipt itself is run by the lead)."""
import importlib.util
import math
import sys
from pathlib import Path

import pytest

from tests.worker.helpers import fake_model, make_profile, make_repo, make_settings

_SPEC = importlib.util.spec_from_file_location("sandbox_gpu_check",
                                               Path(__file__).resolve().parents[3] / "bench" / "worker" / "sandbox_gpu_check.py")
check = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(check)


def test_summary_and_comparison():
    assert check.aa_delta([100, 100, 101], [102, 102, 99]) == pytest.approx(math.log(102 / 100))
    s = check.summarize({"freeze": {"g": [0.01, -0.01, 0.0]}, "no_freeze": {"g": [0.02, -0.02, 0.0], "h": [0.1]}})
    assert s["freeze"]["g"]["n"] == 3 and s["freeze"]["g"]["median_abs_delta_pct"] == pytest.approx(1.0)
    assert s["freeze"]["g"]["spread_pct"] == pytest.approx(1.0) and s["no_freeze"]["h"]["spread_pct"] is None
    assert check.noise_not_worse(s) == {"g": True}
    worse = check.summarize({"freeze": {"g": [0.05, -0.05]}, "no_freeze": {"g": [0.01, -0.01]}})
    assert check.noise_not_worse(worse) == {"g": False}


@pytest.mark.sandbox
def test_measure_on_cpu_with_the_fake_runtime(tmp_path, cache):
    repo = make_repo(tmp_path)
    prof = make_profile(fake_model(tmp_path / "m.gguf"), inner=1)
    model = prof.models[0].model_copy(update={"decode_contexts": [32], "prefill_contexts": [64]})
    m = check.measure(repo, model, "cpu", "auto", 2, 2, tmp_path / "w", make_settings(prof), "test")
    assert set(m["deltas"]) == {"freeze", "no_freeze"}
    assert all(len(v) == 2 for mode in m["deltas"].values() for v in mode.values())
    iso = m["isolation"]["head"]
    assert iso["full"] and iso["facts"]["CapEff"] == "0000000000000000" and iso["limits"]["pids_max"]
