"""The A/A null model: its false-significance bound holds whatever the shape of the noise."""
import math

import numpy as np
import pytest

from worker.gates.noise import false_significance_bound, floor_from_history, gate_null, pairs_needed


def test_bound_formula_and_pairs_needed():
    assert false_significance_bound(20, 1, 1) == pytest.approx(1 / 21)
    assert false_significance_bound(16, 1, 4) == pytest.approx(24 / (17 * 18 * 19 * 20))
    # quick profile: 4 gates, 1e-3 per evaluation → 2.5e-4 per gate; 16 A/A pairs need 4 agreeing pairs
    assert pairs_needed(16, 1, 2.5e-4, 4) == 4
    assert pairs_needed(15, 1, 2.5e-4, 4) is None
    assert pairs_needed(27, 1, 2.5e-4, 4) == 3
    assert pairs_needed(88, 1, 2.5e-4, 4) == 2


@pytest.mark.parametrize("draw", [
    lambda rng, k: rng.standard_normal(k),
    lambda rng, k: rng.standard_t(1.5, k),  # heavy tails: a Gaussian fit would under-state them
    lambda rng, k: rng.exponential(1.0, k) * rng.choice([-1, 1], k) + 0.3 * rng.standard_normal(k),
])
def test_bound_holds_for_any_noise_shape(draw):
    """Simulate many calibrate-then-evaluate cycles: the rate of m pairs all beyond the floor is
    what the bound says (n=10, m=2 keeps the event frequent enough to count)."""
    rng = np.random.default_rng(1)
    n, m, trials = 10, 2, 200_000
    hist = np.abs(draw(rng, n * trials).reshape(trials, n)).max(axis=1)
    new = np.abs(draw(rng, m * trials).reshape(trials, m))
    rate = float(np.mean((new > hist[:, None]).all(axis=1)))
    bound = false_significance_bound(n, 1, m)  # 2 / (11 * 12) = 0.01515
    assert rate == pytest.approx(bound, rel=0.06)


def test_floor_is_the_rank_th_largest_and_never_below_the_minimum():
    d = [0.01, -0.09, 0.03, -0.04, 0.05]
    assert floor_from_history(d, rank=1, minimum=0.02) == pytest.approx(0.09)
    assert floor_from_history(d, rank=2, minimum=0.02) == pytest.approx(0.05)
    assert floor_from_history([0.001, -0.002], rank=1, minimum=0.02) == pytest.approx(math.log1p(0.02))
    with pytest.raises(ValueError):
        floor_from_history([], rank=1, minimum=0.02)


def test_too_little_history_is_uncalibrated_and_says_how_much_is_needed():
    g = gate_null([0.01] * 5, per_gate_rate=2.5e-4, rank=1, minimum=0.02, max_pairs=4, uncalibrated_floor=0.10)
    assert not g.calibrated and g.bound is None and g.pairs == 4
    assert g.floor == pytest.approx(0.10) and "16 give" in g.reason
    h = gate_null(list(np.linspace(-0.08, 0.08, 30)), per_gate_rate=2.5e-4, rank=1, minimum=0.02, max_pairs=4,
                  uncalibrated_floor=0.10)
    assert h.calibrated and h.pairs == 3 and h.bound <= 2.5e-4
    assert h.log_floor == pytest.approx(0.08)
