import math

import numpy as np
import pytest

from worker.config import EvalSettings
from worker.gates.stats import compare, compare_pairs, pair_delta, significant


def test_compare_detects_a_clear_slowdown():
    rng = np.random.default_rng(0)
    base = list(100 * (1 + 0.01 * rng.standard_normal(6)))
    head = [b * 0.5 for b in base]
    c = compare(base, head)
    assert c.rel_change == pytest.approx(-0.5, abs=1e-9)
    assert c.ci_high < 0 and significant(c, [math.log(0.5)], math.log1p(0.05), 1)


def test_identical_samples_are_not_significant():
    c = compare([10.0, 11.0, 12.0], [10.0, 11.0, 12.0])
    assert c.rel_change == 0 and c.ci_low == 0 and c.ci_high == 0
    assert not significant(c, [0.0], math.log1p(0.02), 1)


def test_small_change_inside_the_noise_floor_is_not_significant():
    base = [100.0, 100.5, 99.5, 100.2, 99.8]
    head = [b * 1.03 for b in base]  # +3%, tight interval, but the floor is 5%
    c = compare(base, head)
    d = [pair_delta(base, head)]
    assert c.ci_low > 0
    assert not significant(c, d, math.log1p(0.05), 1) and significant(c, d, math.log1p(0.02), 1)


def test_significance_needs_every_process_pair_beyond_the_floor_on_one_side():
    base = [100.0, 100.5, 99.5, 100.2]
    slow = [b * 0.8 for b in base]
    pairs = [(base, slow), (base, slow), (base, [b * 0.97 for b in base])]  # the third pair disagrees
    c, deltas = compare_pairs(pairs)
    floor = math.log1p(0.1)
    assert c.ci_high < 0 and deltas[0] == pytest.approx(math.log(0.8))
    assert significant(c, deltas[:2], floor, 2)
    assert not significant(c, deltas[:2], floor, 3)  # too few pairs for the bound
    assert not significant(c, deltas, floor, 3)  # one pair inside the floor
    mixed = [math.log(0.8), math.log(1.25)]  # beyond, but on opposite sides
    assert not significant(c, mixed, floor, 2)


@pytest.mark.parametrize("bad", [[0.0, 1.0], [float("nan"), 1.0], [-1.0, 1.0]])
def test_zero_nan_or_negative_speed_is_refused(bad):
    with pytest.raises(ValueError, match="finite and > 0"):
        compare(bad, [1.0, 1.0])


def test_unpaired_lengths_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        compare([1.0, 2.0, 3.0], [1.0, 2.0])


def test_tiers():
    s = EvalSettings()
    assert [s.tier_for(x) for x in (0.01, 0.02, 0.06, 0.2, 0.5)] == ["none", "S", "M", "L", "XL"]
    assert math.isclose(s.tier_xl, 0.40)
