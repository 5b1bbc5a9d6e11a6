"""The detection run's resampled power (bench/worker/gpu_calibration.py resampled_detection): a gate's
chance of calling a planted slowdown slower, from the pairs recorded, stopping as the pipeline does."""
import numpy as np

from bench.worker.gpu_calibration import resampled_detection
from worker.gates.noise import gate_null


def null_from(sd=0.0025, n=26):
    aa = list(np.random.default_rng(1).normal(0.0, sd, n))
    return gate_null(aa, per_gate_rate=1e-4, minimum=0.001, max_pairs=6, uncalibrated_floor=0.10)


def plant(mean, sd=0.0025, n=10, seed=2):
    return list(np.random.default_rng(seed).normal(mean, sd, n))


def test_a_slowdown_far_beyond_the_floor_is_always_seen():
    null = null_from()
    assert null.calibrated
    assert resampled_detection(plant(-0.03), null) == 1.0


def test_no_change_is_almost_never_called_slower():
    assert resampled_detection(plant(0.0), null_from()) < 0.05


def test_a_speedup_is_never_counted_as_detected_slower():
    assert resampled_detection(plant(+0.03), null_from()) == 0.0


def test_power_grows_with_the_plant_and_too_few_pairs_say_none():
    null = null_from()
    got = [resampled_detection(plant(-x), null) for x in (0.0, 0.004, 0.01)]
    assert got[0] < got[1] < got[2], got  # measured 0.0, 0.12, 1.0 at this null (floor -0.33 %)
    assert resampled_detection([-0.1, -0.1], null) is None
