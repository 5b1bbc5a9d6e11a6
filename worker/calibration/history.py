"""A gate's usable A/A history: expiry, the drift test, and the null built from what is left.

A floor is only as good as the claim that today's A/A noise is the noise it was computed from.
So: rows older than `aa_max_age_days` are not used; the newest `drift_window` pairs (the worker
keeps adding them: one base-vs-base pair per evaluation, worker/calibration/sentinel.py) are
tested against the older ones for a change of spread or location (Mann-Whitney on |delta| and on
delta, Bonferroni over the two), and the spread tests of all the model's gates together (Fisher). On drift the older rows are retired (an epoch row, kept for the
record), the gate is uncalibrated until the history is rebuilt, and the verdict says why. After main's
runtime changed, the rows a floor may use are that runtime's lineage (worker/calibration/runtime_change.py).

A test at level 0.01 misses a 1.5x noisier host about one time in three, and a missed one breaks the
bound several-fold. So a calibrated null is also widened by the host's measured noise ratio
(worker/calibration/scale.py: the newest A/A pairs of all the model's gates against the older ones,
an upper confidence bound), which restores the exact bound whenever the bound covers the true ratio.
"""
from __future__ import annotations

import time

from scipy import stats

from worker.calibration import runtime_change
from worker.calibration.aa_store import AAStore
from worker.config import EvalSettings
from worker.calibration.scale import NoiseRatio, noise_ratio
from worker.gates.noise import GateNull, gate_null, widen


def drift_p(recent: list[float], older: list[float]) -> float:
    """p-value of 'recent A/A pairs come from the same noise as the older ones' (spread or location)."""
    spread = stats.mannwhitneyu([abs(x) for x in recent], [abs(x) for x in older], alternative="greater").pvalue
    where = stats.mannwhitneyu(recent, older, alternative="two-sided").pvalue
    return float(min(1.0, 2 * min(spread, where)))


def gate_lineage(store: AAStore, key: str, profile: str, protocol: str, model: str, gate: str, s: EvalSettings,
                 since: float, runtime: str | None) -> runtime_change.Lineage:
    """A gate's unexpired A/A rows that a floor for `runtime` may use (worker/calibration/runtime_change.py)."""
    rows = store.runtime_rows(key, profile, protocol, model, gate, since=since)
    if not s.runtime_check:
        return runtime_change.Lineage([(d, c) for d, c, _ in rows])
    return runtime_change.lineage(rows, runtime, s.drift_window, s.drift_alpha)


def host_noise_ratio(by_gate: dict[str, list[float]], w: int, confidence: float) -> NoiseRatio | None:
    """The newest `w` A/A pairs of every gate against that gate's older ones (worker/calibration/scale.py)."""
    usable = {g: d for g, d in by_gate.items() if len(d) >= w + 2}
    return noise_ratio({g: d[:w] for g, d in usable.items()}, {g: d[w:] for g, d in usable.items()}, confidence)


def pooled_drift_p(by_gate: dict[str, list[float]], w: int) -> float | None:
    """Host-level drift: the spread tests of every gate of this model combined (Fisher). A noisier host
    is noisier on all gates at once; 8 pairs per gate are too few to see 1.5x alone, 6 gates x 8 are not."""
    ps = [stats.mannwhitneyu([abs(x) for x in d[:w]], [abs(x) for x in d[w:]], alternative="greater").pvalue
          for d in by_gate.values() if len(d) >= 3 * w]
    if len(ps) < 2:
        return None
    return float(stats.combine_pvalues(ps, method="fisher").pvalue)


def current_nulls(store: AAStore, key: str, profile: str, protocol: str, model: str, max_pairs: dict[str, int],
                  s: EvalSettings, *, per_gate_rate: float, now: float | None = None,
                  runtime: str | None = None) -> dict[str, GateNull]:
    """The nulls of a model's gates (`max_pairs`: gate -> most pairs). The host-level tests (pooled drift,
    noise ratio) read one snapshot taken before any gate is retired: retiring the first flagged gate
    must not weaken the test for the next one. `runtime`: the base's runtime tree id, for the check
    after main's runtime changed (worker/calibration/runtime_change.py)."""
    now = time.time() if now is None else now
    since = now - s.aa_max_age_days * 86400
    w = s.drift_window
    lines = {g: gate_lineage(store, key, profile, protocol, model, g, s, since, runtime)
             for g in sorted({*store.gates(key, profile, protocol, model), *max_pairs})}
    by_gate = {g: [d for d, _ in ln.rows] for g, ln in lines.items() if ln.rows}
    pooled = pooled_drift_p(by_gate, w)
    ratio = host_noise_ratio(by_gate, w, s.noise_scale_confidence) if s.noise_scale_check else None
    out = {}
    for gate, most in max_pairs.items():
        line = lines[gate]
        rows = line.rows
        deltas = [d for d, _ in rows]
        kw = dict(per_gate_rate=per_gate_rate, minimum=s.noise_floor_min, max_pairs=most,
                  uncalibrated_floor=s.noise_floor_uncalibrated, rank=s.noise_floor_rank)
        if line.wanted:
            out[gate] = gate_null(deltas, **kw, state="drift", reason=line.note)
            continue
        if len(rows) >= 3 * w:
            p = drift_p(deltas[:w], deltas[w:])
            p = min(p, pooled) if pooled is not None else p
            if p < s.drift_alpha:
                why = (f"A/A noise changed: the newest {w} A/A pairs differ from the {len(rows) - w} before them "
                       f"(p = {p:.1e} < {s.drift_alpha:g}); the floor is being rebuilt from new A/A pairs")
                store.retire_before(key, profile, protocol, model, gate, since=rows[w - 1][1], reason=why)
                out[gate] = gate_null(deltas[:w], **kw, state="drift", reason=why)
                continue
        null = gate_null(deltas, **kw)
        if not null.calibrated and store.epoch_start(key, profile, protocol, model, gate) > 0:
            null = gate_null(deltas, **kw, state="drift",
                             reason=f"history rebuilt after A/A noise changed: {null.reason}")
        elif not null.calibrated and line.note:
            null = gate_null(deltas, **kw, state="drift", reason=f"{line.note}; {null.reason}")
        if null.calibrated and ratio is not None:
            null = widen(null, ratio)
        out[gate] = null
    return out


def current_null(store: AAStore, key: str, profile: str, protocol: str, model: str, gate: str,
                 s: EvalSettings, *, per_gate_rate: float, max_pairs: int, now: float | None = None,
                 runtime: str | None = None) -> GateNull:
    """One gate's null (`current_nulls` for a single gate)."""
    return current_nulls(store, key, profile, protocol, model, {gate: max_pairs}, s, per_gate_rate=per_gate_rate,
                         now=now, runtime=runtime)[gate]
