"""A host noisier than its A/A history: the noise-ratio bound, the widened floors, and the bound they keep."""
import importlib.util
import math
from pathlib import Path

import numpy as np
from scipy import stats

from worker.calibration.aa_store import AAStore
from worker.calibration.history import current_nulls, drift_p, pooled_drift_p
from worker.calibration.scale import noise_ratio
from worker.config import EvalSettings

S = EvalSettings()
KEY = ("k", "standard", "proto", "m")


def _quantiles(n, sd, seed):
    """n evenly spread normal quantiles (a 'typical' sample, no unlucky draws), in a shuffled order."""
    q = stats.norm.ppf((np.arange(n) + 0.5) / n) * sd
    return list(np.random.default_rng(seed).permutation(q))


def _fill(store, gate, older, newer, t0=1e6):
    for i, d in enumerate(older):
        store.add_pair_delta_at(*KEY, gate, d, created=t0 + i)
    for i, d in enumerate(newer):
        store.add_pair_delta_at(*KEY, gate, d, created=t0 + 1000 + i)


def test_ratio_estimates_the_spread_change_and_its_bound_has_the_stated_coverage():
    rng = np.random.default_rng(1)
    ref = {f"g{i}": list(rng.normal(0, 0.003, 400)) for i in range(3)}
    r = noise_ratio({g: list(rng.normal(0, 0.0045, 400)) for g in ref}, ref, 0.8)
    assert 1.35 < r.estimate < 1.65 and r.upper >= r.estimate and r.p_noisier < 1e-6
    same = noise_ratio({g: list(rng.normal(0, 0.003, 400)) for g in ref}, ref, 0.8)
    assert 0.9 < same.estimate < 1.1 and same.p_noisier > 0.01
    # Known size: over fresh draws of a 1.5x noisier host, the bound falls below 1.5 at most ~20 % of the time.
    miss = 0
    for _ in range(300):
        ref = {f"g{i}": list(rng.normal(0, 1, 40)) for i in range(6)}
        new = {g: list(rng.normal(0, 1.5, 8)) for g in ref}
        miss += noise_ratio(new, ref, 0.8).upper < 1.5
    assert miss / 300 < 0.26, miss


def test_floors_widen_by_the_ratio_when_the_drift_test_misses_a_noisier_host(tmp_path):
    """The newest A/A pairs are 1.35x as spread: too little for the drift test, enough to break the bound."""
    store = AAStore(tmp_path / "aa.sqlite")
    older, newer = _quantiles(40, 0.003, 1), _quantiles(8, 0.003 * 1.35, 2)
    _fill(store, "decode@512", older, newer)
    assert drift_p(newer, older) >= S.drift_alpha  # the drift test says nothing here
    now = 1e6 + 5000
    kw = dict(per_gate_rate=1e-3 / 6, now=now)
    plain = current_nulls(store, *KEY, {"decode@512": 4}, S.model_copy(update={"noise_scale_check": False}), **kw)
    wide = current_nulls(store, *KEY, {"decode@512": 4}, S, **kw)
    p, w = plain["decode@512"], wide["decode@512"]
    assert p.calibrated and w.calibrated and p.widening == 1.0
    assert w.widening > 1.2 and math.isclose(w.lo, p.lo * w.widening) and math.isclose(w.hi, p.hi * w.widening)
    assert w.floor_slower > p.floor_slower and w.floor_faster > p.floor_faster
    assert math.isclose(w.aa_sd, p.aa_sd * w.widening)  # the interval over process pairs widens with them


def test_a_quieter_host_keeps_its_floors(tmp_path):
    store = AAStore(tmp_path / "aa.sqlite")
    _fill(store, "decode@512", _quantiles(40, 0.003, 1), _quantiles(8, 0.002, 2))
    n = current_nulls(store, *KEY, {"decode@512": 4}, S, per_gate_rate=1e-3 / 6, now=1e6 + 5000)["decode@512"]
    assert n.calibrated and n.widening == 1.0


def test_host_level_drift_flags_every_gate_not_only_the_first(tmp_path):
    """Retiring the first flagged gate's history must not weaken the pooled test for the next gate."""
    store = AAStore(tmp_path / "aa.sqlite")
    gates = ["decode@128", "decode@512", "prefill@512"]
    for i, g in enumerate(gates):
        _fill(store, g, _quantiles(40, 0.003, 10 + i), _quantiles(8, 0.003 * 2.0, 20 + i))
    by_gate = {g: [d for d, _ in store.pair_rows(*KEY, g)] for g in gates}
    assert all(drift_p(d[:8], d[8:]) >= S.drift_alpha for d in by_gate.values())  # no gate alone
    assert pooled_drift_p(by_gate, 8) < S.drift_alpha  # all together
    assert pooled_drift_p({g: by_gate[g] for g in gates[1:]}, 8) >= S.drift_alpha  # (with the first retired: not)
    nulls = current_nulls(store, *KEY, {g: 4 for g in gates}, S, per_gate_rate=1e-3 / 6, now=1e6 + 5000)
    assert [nulls[g].state for g in gates] == ["drift"] * 3


def _sim():
    path = Path(__file__).resolve().parents[3] / "scripts" / "placebo_power.py"
    spec = importlib.util.spec_from_file_location("placebo_power", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_noisier_host_keeps_the_stated_rate(tmp_path):
    """The placebo simulation's own arithmetic, small: a host 1.5x noisier than at calibration, H200-like
    noise. Without the widening the drift test alone leaves the rate several times the stated 1e-3."""
    sim = _sim()
    rng = np.random.default_rng(7)
    store = AAStore(tmp_path / "aa.sqlite")
    sample = sim.pair_delta_sample(0.002 * 1.5, 0.002 * 1.5, 5, 100_000, rng)
    rates = {"before": [], "after": []}
    for h in range(60):
        hist = sim.calibration(sim.Host(0.002, 0.002, 5, rng), 40)
        recent = sim.calibration(sim.Host(0.003, 0.003, 5, rng), S.drift_window)
        for name, check in (("before", False), ("after", True)):
            sim.fill(store, f"{h}-{name}", hist, recent, 1e6)
            nulls = sim.worker_nulls(store, f"{h}-{name}", S.model_copy(update={"noise_scale_check": check}), 4,
                                     1e6 + 5000)
            rates[name].append(1 - math.prod(1 - sim.exceed(n, sample) for n in nulls.values()))
    before, after = float(np.mean(rates["before"])), float(np.mean(rates["after"]))
    assert after < S.false_significance_rate / 2 and before > 2 * after, (before, after)


def test_a_widened_floor_is_said_in_the_verdict_notes(tmp_path, monkeypatch):
    """The comment says when and how much the floors were widened (a maintainer reads a larger detectable change)."""
    from worker.gates.judge import ModelOutcome
    from worker.pipeline import Evaluation, Job
    from worker.records import GateResult

    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path / "cache"))
    ev = Evaluation(Job(repo=str(tmp_path), base_ref="main", head_ref="pr"), EvalSettings(), workdir=tmp_path / "w")

    def gate(name, widening):
        return GateResult(model="m", gate=name, metric="decode_tok_s", base_median=100.0, head_median=100.0,
                          rel_change=0.0, ci_low=-0.01, ci_high=0.01, noise_floor=0.02, significant=False,
                          regression=False, scored=True, n_pairs=1, floor_slower=0.02, floor_faster=0.02,
                          floor_widening=widening)

    r = ev.decide({"m": ModelOutcome(gates=[gate("decode@32", 1.0), gate("decode@128", 1.42)])})
    notes = [n for n in r.notes if "widened" in n]
    assert len(notes) == 1 and notes[0].startswith("m: noise floors widened ×1.42")
    r = ev.decide({"m": ModelOutcome(gates=[gate("decode@32", 1.0)])})
    assert not any("widened" in n for n in r.notes)
