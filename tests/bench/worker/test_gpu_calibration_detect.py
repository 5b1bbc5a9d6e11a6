"""`gpu_calibration.py detect` continuing a committed state on a fresh box (bench/device/pending.sh restore):
the state says calibration is done, but the box has no clone with the plant branches yet."""
import json
import subprocess

import pytest

from bench.worker import gpu_calibration as gc


def test_detect_on_a_restored_state_makes_its_clone_first(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"main": "0" * 40, "profile": "quick",
                                                     "calibrate": {"done": True}}))
    # a budget under the 30 s a pair needs: the step sets up, then stops before any pair
    gc.main(["--state", str(tmp_path), "--budget", "1", "--plants", "1", "detect"])
    repo = tmp_path / "repo"
    heads = subprocess.run(["git", "-C", str(repo), "branch", "--format=%(refname:short)"], capture_output=True,
                           text=True, check=True).stdout.split()
    assert {"main", gc.plant_branch(0.01)} <= set(heads)
    assert json.loads((tmp_path / "state.json").read_text())["main"] != "0" * 40  # main is this tree's snapshot


@pytest.mark.parametrize("text", ["0", "100", "1,-2", "one"])
def test_plants_are_percents_between_0_and_100(text):
    with pytest.raises((ValueError, SystemExit)):
        gc.main(["--state", "/nonexistent/never-made", "--plants", text, "detect"])


def test_detection_can_be_kept_to_some_models():
    rec = {"deltas": {"small decode@128": [0.0] * 3, "big decode@128": [0.0]}}
    assert gc.detect_wants(rec, "small", ["decode@128"], 5, [])  # every model, 3 of 5
    assert not gc.detect_wants(rec, "big", ["decode@128"], 5, ["small"])  # not chosen
    assert gc.detect_wants(rec, "small", ["decode@128"], 5, ["small"])
    assert not gc.detect_wants(rec, "small", ["decode@128"], 3, ["small"])  # has its 3
    assert not gc.detect_wants(rec, "small", [], 5, [])  # no gates
