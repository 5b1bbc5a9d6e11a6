import math

import numpy as np
import pytest

from worker.config import EvalSettings
from worker.gates.stats import compare, compare_pairs, pair_delta, pair_interval


def test_compare_detects_a_clear_slowdown():
    rng = np.random.default_rng(0)
    base = list(100 * (1 + 0.01 * rng.standard_normal(6)))
    head = [b * 0.5 for b in base]
    c = compare(base, head)
    assert c.rel_change == pytest.approx(-0.5, abs=1e-9)
    assert c.ci_high < 0


def test_identical_samples_are_not_significant():
    c = compare([10.0, 11.0, 12.0], [10.0, 11.0, 12.0])
    assert c.rel_change == 0 and c.ci_low == 0 and c.ci_high == 0


def test_interval_is_over_process_pairs_and_honest_under_process_offsets():
    """A/A with 1.5 % process offsets and tight reps: the interval over process pairs covers 0 about 95 %
    of the time; the old interval over reps (bootstrap of every rep) excludes 0 far more often."""
    rng = np.random.default_rng(7)
    aa = list(rng.normal(0, 0.015, 40))
    miss_pairs = miss_reps = 0
    trials = 300
    for _ in range(trials):
        pairs = []
        for _p in range(3):
            off = rng.normal(0, 0.015)
            base = list(100 * np.exp(rng.normal(0, 0.002, 5)))
            pairs.append((base, [b * math.exp(off + rng.normal(0, 0.002)) for b in base]))
        c, d, how = compare_pairs(pairs, aa_sd=float(np.std(aa, ddof=1)), aa_n=len(aa))
        assert "process pairs" in how and c.n_pairs == 3
        miss_pairs += not (c.ci_low <= 0 <= c.ci_high)
        r = compare([x for b, _ in pairs for x in b], [x for _, h in pairs for x in h], n_resamples=300)
        miss_reps += not (r.ci_low <= 0 <= r.ci_high)
    assert miss_pairs / trials < 0.09
    assert miss_reps / trials > 0.2


def test_one_pair_without_history_has_no_interval():
    lo, hi, how = pair_interval([0.01], aa_sd=None, aa_n=0)
    assert lo is None and hi is None and "no interval" in how


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
