"""A gate's usable A/A history: expiry, the drift test, and the null built from what is left.

A floor is only as good as the claim that today's A/A noise is the noise it was computed from.
So: rows older than `aa_max_age_days` are not used; the newest `drift_window` pairs (the worker
keeps adding them: one base-vs-base pair per evaluation, worker/calibration/sentinel.py) are
tested against the older ones for a change of spread or location (Mann-Whitney on |delta| and on
delta, Bonferroni over the two), and the spread tests of all the model's gates together (Fisher). On drift the older rows are retired (an epoch row, kept for the
record), the gate is uncalibrated until the history is rebuilt, and the verdict says why.
"""
from __future__ import annotations

import time

from scipy import stats

from worker.calibration.aa_store import AAStore
from worker.config import EvalSettings
from worker.gates.noise import GateNull, gate_null


def drift_p(recent: list[float], older: list[float]) -> float:
    """p-value of 'recent A/A pairs come from the same noise as the older ones' (spread or location)."""
    spread = stats.mannwhitneyu([abs(x) for x in recent], [abs(x) for x in older], alternative="greater").pvalue
    where = stats.mannwhitneyu(recent, older, alternative="two-sided").pvalue
    return float(min(1.0, 2 * min(spread, where)))


def pooled_drift_p(store: AAStore, key: str, profile: str, protocol: str, model: str, w: int, since: float) -> float | None:
    """Host-level drift: the spread tests of every gate of this model combined (Fisher). A noisier host
    is noisier on all gates at once; 8 pairs per gate are too few to see 1.5x alone, 6 gates x 8 are not."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(store.path)) as db:
        gates = [r[0] for r in db.execute("SELECT DISTINCT gate FROM pair_delta WHERE host=? AND profile=? AND "
                                          "protocol=? AND model=?", (key, profile, protocol, model))]
    ps = []
    for g in gates:
        d = [x for x, _ in store.pair_rows(key, profile, protocol, model, g, since=since)]
        if len(d) >= 3 * w:
            ps.append(stats.mannwhitneyu([abs(x) for x in d[:w]], [abs(x) for x in d[w:]],
                                         alternative="greater").pvalue)
    if len(ps) < 2:
        return None
    return float(stats.combine_pvalues(ps, method="fisher").pvalue)


def current_null(store: AAStore, key: str, profile: str, protocol: str, model: str, gate: str,
                 s: EvalSettings, *, per_gate_rate: float, max_pairs: int, now: float | None = None) -> GateNull:
    now = time.time() if now is None else now
    rows = store.pair_rows(key, profile, protocol, model, gate, since=now - s.aa_max_age_days * 86400)
    deltas = [d for d, _ in rows]
    w = s.drift_window
    kw = dict(per_gate_rate=per_gate_rate, minimum=s.noise_floor_min, max_pairs=max_pairs,
              uncalibrated_floor=s.noise_floor_uncalibrated, rank=s.noise_floor_rank)
    if len(rows) >= 3 * w:
        p = drift_p(deltas[:w], deltas[w:])
        pooled = pooled_drift_p(store, key, profile, protocol, model, w, now - s.aa_max_age_days * 86400)
        p = min(p, pooled) if pooled is not None else p
        if p < s.drift_alpha:
            why = (f"A/A noise changed: the newest {w} A/A pairs differ from the {len(rows) - w} before them "
                   f"(p = {p:.1e} < {s.drift_alpha:g}); the floor is being rebuilt from new A/A pairs")
            store.retire_before(key, profile, protocol, model, gate, since=rows[w - 1][1], reason=why)
            return gate_null(deltas[:w], **kw, state="drift", reason=why)
    null = gate_null(deltas, **kw)
    if not null.calibrated and store.epoch_start(key, profile, protocol, model, gate) > 0:
        null = gate_null(deltas, **kw, state="drift", reason=f"history rebuilt after A/A noise changed: {null.reason}")
    return null
