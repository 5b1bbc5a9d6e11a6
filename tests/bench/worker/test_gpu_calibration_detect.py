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


def test_a_plant_is_judged_model_by_model():
    """The 9B's planted pairs were run after the 0.8B's (its own call): the 0.8B's six pairs are two
    evaluations of three, not cut to the 9B's three (read jointly, both models made one)."""
    from worker.gates.noise import GateNull

    null = GateNull(lo=-0.005, hi=0.005, pairs=3, calibrated=True, aa_deltas=20, bound=1e-4)
    deltas = {"small decode@128": [-0.01] * 6, "small prefill@4096": [-0.01] * 6, "big decode@128": [-0.01] * 3}
    fig = gc.plant_figures(deltas, {k: null for k in deltas})
    assert fig["evaluations"] == {"small": 2, "big": 1}
    assert fig["pairs"] == {"small": 6, "big": 3}
    assert fig["detected_slower"] == {k: 1.0 for k in deltas}


def test_planted_pairs_are_counted_for_the_models_asked():
    rec = {"deltas": {"small decode@128": [0.0] * 12, "big decode@128": [0.0] * 2}}
    assert gc.recorded(rec, ["small"]) == 12
    assert gc.recorded(rec, ["big"]) == 2  # a 9B run after the 0.8B's 12 still wants its own
    assert gc.recorded(rec, []) == 2
    assert gc.recorded({"deltas": {}}, ["big"]) == 0
