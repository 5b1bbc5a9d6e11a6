"""The A/A null model: its false-significance bound holds whatever the shape of the noise, and its
floor is the measured spread (no fixed minimum that throws the H200's small noise away)."""
import math

import numpy as np
import pytest

from worker.gates.noise import choose_design, exceed_bound, false_significance_bound, gate_null, history_needed


def test_bound_is_the_beta_binomial_tail_in_closed_form():
    assert exceed_bound(20, 1, 1) == pytest.approx(1 / 21)
    assert exceed_bound(16, 1, 4) == pytest.approx(24 / (17 * 18 * 19 * 20))
    for n, r, m in [(50, 3, 4), (200, 20, 4), (30, 5, 6)]:
        assert exceed_bound(n, r, m) == pytest.approx(false_significance_bound(n, r, m))


def test_design_meets_the_rate_and_depends_on_the_history_size_only():
    for n in (16, 30, 50, 120, 400):
        d = choose_design(n, 8.3e-5, 6)
        assert d is not None and d.bound_per_side <= 8.3e-5 and 1 <= d.rank <= n and 1 <= d.pairs <= 6
    # more history: a floor further inside the A/A spread, a smaller detectable change
    assert choose_design(400, 8.3e-5, 4).mdc_sd < choose_design(50, 8.3e-5, 4).mdc_sd
    assert choose_design(400, 8.3e-5, 4).rank > choose_design(50, 8.3e-5, 4).rank
    assert choose_design(history_needed(8.3e-5, 4) - 1, 8.3e-5, 4) is None


@pytest.mark.parametrize("draw", [
    lambda rng, k: rng.standard_normal(k),
    lambda rng, k: rng.standard_t(1.5, k),  # heavy tails: a Gaussian fit would under-state them
    lambda rng, k: rng.exponential(1.0, k) * rng.choice([-1, 1], k) + 0.3 * rng.standard_normal(k),
])
def test_bound_holds_for_any_noise_shape(draw):
    """Many calibrate-then-evaluate cycles through gate_null itself: the rate at which m fresh A/A pairs
    all land below the slower floor is what the bound says (a loose rate keeps the event countable)."""
    rng = np.random.default_rng(1)
    n, trials = 12, 40_000
    hist = draw(rng, n * trials).reshape(trials, n) * 0.01
    null = gate_null(list(hist[0]), per_gate_rate=0.06, minimum=0.0, max_pairs=2, uncalibrated_floor=0.1)
    assert null.calibrated
    m, r = null.pairs, null.rank
    lo = np.sort(hist, axis=1)[:, r - 1]
    new = draw(rng, m * trials).reshape(trials, m) * 0.01
    rate = float(np.mean((new < np.minimum(lo, 0)[:, None]).all(axis=1)))
    assert rate <= exceed_bound(n, r, m) * 1.1 and rate == pytest.approx(exceed_bound(n, r, m), rel=0.12)


def test_floor_is_the_measured_spread_not_a_fixed_minimum():
    """H200-like decode noise (±0.1-0.4 %): the floors stay well under 1 % (a 2 % minimum fails this)."""
    from worker.config import EvalSettings

    rng = np.random.default_rng(3)
    d = list(rng.normal(0, 0.002, 60))
    s = EvalSettings()
    g = gate_null(d, per_gate_rate=1.7e-4, minimum=s.noise_floor_min, max_pairs=6, uncalibrated_floor=0.1)
    assert g.calibrated and g.floor < 0.008 and -math.expm1(g.lo) < 0.008, g
    assert g.lo < 0 < g.hi and g.bound <= 1.7e-4


def test_one_sided_floors_follow_each_tail():
    d = [0.001 * i for i in range(-5, 40)]  # a long faster tail, a short slower one
    g = gate_null(d, per_gate_rate=0.2, minimum=0.0, max_pairs=2, uncalibrated_floor=0.1)
    assert g.hi > -g.lo
    assert g.side([g.lo - 1e-4] * g.pairs) == -1 and g.side([g.hi + 1e-4] * g.pairs) == 1
    assert g.side([g.lo - 1e-4, g.hi + 1e-4]) == 0  # beyond, but on opposite sides
    assert g.significant([g.lo - 1e-4] * (g.pairs - 1)) == 0 if g.pairs > 1 else True


def test_too_little_history_is_uncalibrated_and_says_how_much_is_needed():
    g = gate_null([0.01] * 5, per_gate_rate=5e-4, minimum=0.0, max_pairs=4, uncalibrated_floor=0.10)
    assert not g.calibrated and g.bound is None and g.pairs == 4 and g.state == "uncalibrated"
    assert g.floor == pytest.approx(0.10) and f"{history_needed(2.5e-4, 4)} give" in g.reason
    drift = gate_null([0.01] * 50, per_gate_rate=5e-4, minimum=0.0, max_pairs=4, uncalibrated_floor=0.1,
                      state="drift", reason="noise changed")
    assert not drift.calibrated and drift.reason == "noise changed"
