"""Placebo and power of the speed gates, through the project's own gate_null / compare_pairs / decide.

`simulate` (default): realistic noise — per process pair a speed offset (sd `--offset`), per rep an
ABBA log-ratio noise (sd `--rep`). Each calibration draw records `--history` A/A pairs per gate at 1x,
then the worker's newest `drift_window` A/A pairs (sentinels) come from a host 1x / 1.25x / 1.5x / 2x
noisier (`--factors`), and the nulls are what the worker's own store gives an evaluation
(worker/calibration/history.py: expiry, drift test, noise-ratio widening), for three designs:
"floors only", "drift test (before)" (noise_scale_check off) and "... + noise-ratio widening (after)".
Printed per noise setting and factor:
  - false significance per A/A evaluation (any gate significant): per calibration draw the exact chance
    given its nulls (all `pairs` fresh pairs beyond one floor, pair deltas sampled `--sample` times),
    averaged over `--histories` draws, with its standard error; cross-checked by `--trials` evaluations
    judged end to end through judge() / decide();
  - at 1x: detection of planted 1 / 2 / 5 % slowdowns on decode@512 and the minimum detectable change
    (90 % detection), per design and uncalibrated.
`cpu-placebo`: a real A/A placebo run of the quick profile on this CPU (worker/calibration/placebo.py),
printing its counts and the bound.

Both write a receipt to bench/receipts/ (`--out`).

    python scripts/placebo_power.py simulate --histories 400 --trials 400
    python scripts/placebo_power.py cpu-placebo --evaluations 20
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker.config import EvalSettings  # noqa: E402
from worker.gates.noise import gate_null, history_needed  # noqa: E402
from worker.gates.stats import compare_pairs  # noqa: E402
from worker.records import GateResult, Verdict  # noqa: E402
from worker.verdicts.rules import decide  # noqa: E402

# The standard profile's gates: 0.8B decode@128/512/4096, prefill@512/4096 + the 4B guard's decode@512.
GATES = ["decode@128", "decode@512", "decode@4096", "prefill@512", "prefill@4096", "guard decode@512"]


class Host:
    """ABBA samples of one process pair: base/head tok/s with a shared pair offset and rep noise."""

    def __init__(self, offset_sd: float, rep_sd: float, reps: int, rng: np.random.Generator):
        self.offset_sd, self.rep_sd, self.reps, self.rng = offset_sd, rep_sd, reps, rng

    def pair(self, change: float = 0.0) -> tuple[list[float], list[float]]:
        off = self.rng.normal(0, self.offset_sd)
        base = 100 * np.exp(self.rng.normal(0, self.rep_sd / math.sqrt(2), self.reps))
        head = base * math.exp(math.log1p(change) + off) * np.exp(self.rng.normal(0, self.rep_sd / math.sqrt(2),
                                                                                   self.reps))
        return list(base), list(head)


def judge(host: Host, nulls: dict, s: EvalSettings, changes: dict[str, float]):
    """One evaluation, as the pipeline runs it: pairs per gate until no gate wants more, then decide."""
    gates, uncal = [], {}
    pairs = {g: [host.pair(changes.get(g, 0.0))] for g in GATES}
    from worker.gates.stats import pair_delta

    while True:
        want = [g for g in GATES if nulls[g].wants_more([pair_delta(b, h) for b, h in pairs[g]])]
        if not want:
            break
        # a new process pair measures every gate (as a real fresh pair does)
        for g in GATES:
            pairs[g].append(host.pair(changes.get(g, 0.0)))
    for g in GATES:
        null = nulls[g]
        c, deltas, _ = compare_pairs(pairs[g], aa_sd=null.aa_sd, aa_n=null.aa_deltas)
        side = null.significant(deltas)
        if not null.calibrated:
            uncal[f"m {g}"] = null.reason or "uncalibrated"
        gates.append(GateResult(model="m", gate=g, metric="decode_tok_s", base_median=100.0, head_median=100.0,
                                rel_change=c.rel_change, ci_low=c.ci_low, ci_high=c.ci_high, noise_floor=null.floor,
                                significant=side != 0, regression=side < 0, scored=not g.startswith("guard"),
                                n_pairs=c.n_pairs))
    return decide(gates, [], [], uncal, s), gates


def nulls_from(hist: dict[str, list[float]], s: EvalSettings, max_pairs: int) -> dict:
    rate = s.false_significance_rate / len(GATES)
    return {g: gate_null(hist[g], per_gate_rate=rate, minimum=s.noise_floor_min, max_pairs=max_pairs,
                         uncalibrated_floor=s.noise_floor_uncalibrated) for g in GATES}


def calibration(host: Host, n: int) -> dict[str, list[float]]:
    from worker.gates.stats import pair_delta

    return {g: [pair_delta(*host.pair()) for _ in range(n)] for g in GATES}


def pair_delta_sample(offset_sd: float, rep_sd: float, reps: int, size: int, rng) -> np.ndarray:
    """Sorted draws of one A/A pair delta of `Host` (pair offset + median of the reps' log ratios)."""
    off = rng.normal(0, offset_sd, size)
    return np.sort(off + np.median(rng.normal(0, rep_sd / math.sqrt(2), (size, reps)), axis=1))


def exceed(null, sample: np.ndarray, shift: float = 0.0) -> float:
    """P(this gate is significant in one evaluation | its null), for pairs drawn from `sample` + shift:
    all `null.pairs` fresh pairs beyond the same floor (GateNull.significant; early stopping changes nothing)."""
    lo = np.searchsorted(sample, null.lo - shift, side="left") / len(sample)
    hi = 1 - np.searchsorted(sample, null.hi - shift, side="right") / len(sample)
    return float(lo ** null.pairs + hi ** null.pairs)


def worker_nulls(store, host: str, s: EvalSettings, max_pairs: int, now: float) -> dict:
    """The nulls an evaluation gets from the worker's store (expiry, drift test, noise-ratio widening)."""
    from worker.calibration.history import current_nulls

    return current_nulls(store, host, "standard", "p", "m", {g: max_pairs for g in GATES}, s,
                         per_gate_rate=s.false_significance_rate / len(GATES), now=now)


def fill(store, host: str, hist: dict, recent: dict, t0: float):
    """Calibration rows, then the newest A/A pairs (sentinels) after them, as the worker records them."""
    import sqlite3
    from contextlib import closing

    rows = [(host, "standard", "p", "m", g, float(d), None, t0 + i) for g in GATES for i, d in enumerate(hist[g])]
    rows += [(host, "standard", "p", "m", g, float(d), None, t0 + 1000 + i) for g in GATES
             for i, d in enumerate(recent[g])]
    with closing(sqlite3.connect(store.path)) as db, db:  # one transaction (store.add_pair_delta_at commits each)
        db.executemany("INSERT INTO pair_delta (host, profile, protocol, model, gate, delta, sha, created) "
                       "VALUES (?,?,?,?,?,?,?,?)", rows)


DESIGNS = {  # name -> (settings overrides, use the worker's store)
    "floors only": ({}, False),
    "drift test (before)": ({"noise_scale_check": False}, True),
    "drift test + noise-ratio widening (after)": ({"noise_scale_check": True}, True),
}


def simulate(args) -> dict:
    import tempfile

    from worker.calibration.aa_store import AAStore

    base = EvalSettings(**({"noise_scale_confidence": args.scale_confidence} if args.scale_confidence else {}))
    rng = np.random.default_rng(args.seed)
    out = {"kind": "placebo_power_simulation",
           "config": {"gates": GATES, "false_significance_rate": base.false_significance_rate, "reps": args.reps,
                      "max_pairs": args.max_pairs, "calibration_pairs_per_gate": args.history,
                      "factors": args.factors, "noise": [list(x) for x in args.noise], "seed": args.seed,
                      "drift_window": base.drift_window, "drift_alpha": base.drift_alpha,
                      "noise_scale_confidence": base.noise_scale_confidence, "designs": list(DESIGNS)},
           "n": {"histories_per_factor": args.histories, "pair_delta_draws": args.sample,
                 "judged_evaluations_per_factor_and_design": args.histories * (args.trials // args.histories)},
           "method": "per calibration draw, the exact chance that an A/A evaluation has any significant gate given the "
                     "worker's nulls (pair-delta distribution sampled `pair_delta_draws` times), averaged over the "
                     "draws; cross-checked by evaluations judged end to end through judge()/decide()",
           "results": []}
    need = history_needed(base.false_significance_rate / len(GATES) / 2, args.max_pairs)
    tmp = tempfile.TemporaryDirectory()
    store = AAStore(Path(tmp.name) / "aa.sqlite")
    now = 1e9
    for offset, rep in args.noise:
        row = {"offset_sd": offset, "rep_sd": rep, "history_needed": need, "false": {}, "detect": {}, "mdc": {}}
        t0 = time.monotonic()
        samples = {k: pair_delta_sample(offset * k, rep * k, args.reps, args.sample, rng) for k in args.factors}
        grid = np.arange(0.0005, 0.2001, 0.0005)
        for k in args.factors:
            host = Host(offset * k, rep * k, args.reps, rng)
            res = {name: {"rates": [], "uncal": 0, "widening": [], "hits": 0, "harm": 0, "judged": 0, "bounds": []}
                   for name in DESIGNS}
            power = {name: np.zeros(len(grid)) for name in DESIGNS}
            for h in range(args.histories):
                hist = calibration(Host(offset, rep, args.reps, rng), args.history)
                recent = calibration(host, base.drift_window)
                for name, (over, via_store) in DESIGNS.items():
                    s = base.model_copy(update=over)
                    if via_store:
                        key = f"{offset}-{rep}-{k}-{h}-{name}"
                        fill(store, key, hist, recent, now)
                        nulls = worker_nulls(store, key, s, args.max_pairs, now + 5000)
                    else:
                        nulls = nulls_from({g: hist[g] + recent[g] for g in GATES}, s, args.max_pairs)
                    r = res[name]
                    r["rates"].append(1 - math.prod(1 - exceed(nulls[g], samples[k]) for g in GATES))
                    r["uncal"] += any(not n.calibrated for n in nulls.values())
                    if all(n.bound is not None for n in nulls.values()):  # what the comment states
                        r["bounds"].append(sum(n.bound for n in nulls.values()))
                    r["widening"].append(nulls["decode@512"].widening)
                    if k == 1.0:
                        power[name] += [exceed(nulls["decode@512"], samples[k], math.log1p(-p)) for p in grid]
                    for _ in range(args.trials // args.histories):
                        d, gs = judge(host, nulls, s, {})
                        r["hits"] += any(g.significant for g in gs)
                        r["harm"] += d.verdict not in (Verdict.NONE, Verdict.UNCALIBRATED)
                        r["judged"] += 1
            row["false"][f"{k}x"] = {
                name: {"false_significance_per_evaluation": float(np.mean(r["rates"])),
                       "standard_error": float(np.std(r["rates"], ddof=1) / math.sqrt(len(r["rates"]))),
                       "histories": len(r["rates"]),
                       "said_uncalibrated_or_drift": r["uncal"] / args.histories,
                       "mean_widening": float(np.mean(r["widening"])),
                       "bound_stated_mean": float(np.mean(r["bounds"])) if r["bounds"] else None,
                       "judged_evaluations": r["judged"], "judged_significant": r["hits"],
                       "judged_false_verdicts": r["harm"]} for name, r in res.items()}
            if k == 1.0:
                for name in DESIGNS:
                    det = power[name] / args.histories
                    row["detect"][name] = {f"{p:.0%}": float(det[np.argmin(abs(grid - p))]) for p in (0.01, 0.02, 0.05)}
                    ok = np.nonzero(det >= 0.9)[0]
                    row["mdc"][name] = float(grid[ok[0]]) if len(ok) else None  # None: above 20 %
        unc = nulls_from({g: [] for g in GATES}, base, args.max_pairs)["decode@512"]
        det = np.array([exceed(unc, samples[1.0], math.log1p(-p)) for p in grid])
        ok = np.nonzero(det >= 0.9)[0]
        row["detect"]["uncalibrated"] = {f"{p:.0%}": float(det[np.argmin(abs(grid - p))]) for p in (0.01, 0.02, 0.05)}
        row["mdc"]["uncalibrated"] = float(grid[ok[0]]) if len(ok) else None
        row["seconds"] = round(time.monotonic() - t0, 1)
        out["results"].append(row)
        print_row(row, base.false_significance_rate)
    tmp.cleanup()
    return out


def print_row(row, rate):
    print(f"\nnoise: process offset sd {row['offset_sd']:.2%}, rep sd {row['rep_sd']:.2%} "
          f"(history needed {row['history_needed']} A/A pairs; stated rate {rate:.0e} per evaluation)")
    for k, by in row["false"].items():
        for name, f in by.items():
            print(f"  host {k:>4} {name:>42}: false significance/eval {f['false_significance_per_evaluation']:.2e} "
                  f"(se {f['standard_error']:.1e}); uncalibrated/drift {f['said_uncalibrated_or_drift']:.0%}; "
                  f"widening x{f['mean_widening']:.2f}; judged {f['judged_significant']}/{f['judged_evaluations']}")
    for label, d in row["detect"].items():
        mdc = row["mdc"][label]
        print(f"  {label:>42}: detect 1% {d['1%']:.0%}  2% {d['2%']:.0%}  5% {d['5%']:.0%}   "
              f"MDC(90%) {'n/a' if mdc is None else f'{mdc:.2%}'}")


def cpu_placebo(args) -> dict:
    import subprocess
    import tempfile

    from worker.calibration.aa_store import AAStore
    from worker.calibration.placebo import run_placebo
    from worker.gates.noise import history_needed as hn

    s = EvalSettings(profile="quick")
    p = s.profile_settings("quick")
    gates = sum(len(m.gate_names()) for m in p.models)
    calib = args.calibrate or hn(s.false_significance_rate / gates / 2, p.max_process_pairs)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(repo)], check=True)
        t0 = time.monotonic()
        rep = run_placebo(str(repo), "HEAD", s, evaluations=args.evaluations, calibrate=calib,
                          workdir=Path(tmp) / "w", store=AAStore(Path(tmp) / "aa.sqlite"), trusted_root=ROOT)
    bound = sum(b for b in rep.bounds.values() if b is not None) if all(rep.bounds.values()) else None
    out = {"kind": "cpu_placebo", "profile": "quick", "calibration_pairs": calib, "evaluations": rep.evaluations,
           "verdicts": rep.verdicts, "significant_evaluations": rep.significant_evaluations,
           "false_rejects": rep.false_rejects, "false_tiers": rep.false_tiers, "bound_per_evaluation": bound,
           "seconds_per_evaluation": rep.seconds_per_evaluation, "seconds": round(time.monotonic() - t0, 1),
           "noise": rep.noise_table(), "process_pairs": rep.process_pairs,
           "noise_scale_check": s.noise_scale_check, "widening_last_evaluation": rep.widening}
    print(f"CPU placebo (quick): {rep.evaluations} A/A evaluations after {calib} calibration pairs per gate")
    print(f"  verdicts {rep.verdicts}; evaluations with any significant gate: {rep.significant_evaluations}; "
          f"bound per evaluation {bound if bound is None else f'{bound:.1e}'}")
    print(f"  P(>= 1 of {rep.evaluations} significant | bound) <= "
          f"{'n/a' if bound is None else f'{1 - (1 - bound) ** rep.evaluations:.1e}'}")
    for g, t in rep.noise_table().items():
        print(f"  {g}: n={t['n']} median|d| {t['median_abs']:.2%} p95 {t['p95_abs']:.2%} floor {t['floor']:.2%} "
              f"pairs {t['pairs_needed']}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    a = sub.add_parser("simulate")
    a.add_argument("--trials", type=int, default=400, help="A/A evaluations judged end to end per factor and design")
    a.add_argument("--histories", type=int, default=400, help="independent calibration draws per factor")
    a.add_argument("--sample", type=int, default=200_000, help="draws of the pair-delta distribution")
    a.add_argument("--factors", type=float, nargs="+", default=[1.0, 1.5, 2.0], help="host noise / calibration noise")
    a.add_argument("--history", type=int, default=40, help="A/A pairs per gate at calibration")
    a.add_argument("--reps", type=int, default=5)
    a.add_argument("--scale-confidence", type=float, default=None, help="override noise_scale_confidence")
    a.add_argument("--max-pairs", type=int, default=4)
    a.add_argument("--seed", type=int, default=13)
    a.add_argument("--noise", type=lambda x: tuple(float(v) for v in x.split(",")), nargs="+",
                   default=[(0.002, 0.002), (0.005, 0.003), (0.01, 0.01), (0.02, 0.01)],
                   help="offset_sd,rep_sd pairs (log units)")
    b = sub.add_parser("cpu-placebo")
    b.add_argument("--evaluations", type=int, default=20)
    b.add_argument("--calibrate", type=int, default=0, help="0 = the fewest that meet the rate")
    for p in (a, b):
        p.add_argument("--out", default=str(ROOT / "bench" / "receipts"))
    args = ap.parse_args(argv)
    cmd = args.cmd or "simulate"
    if args.cmd is None:
        args = ap.parse_args(["simulate", *(argv or [])])
    out = simulate(args) if cmd == "simulate" else cpu_placebo(args)
    out["created"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    out["argv"] = sys.argv[1:]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(args.out) / f"{'placebo-power-sim' if cmd == 'simulate' else 'placebo-cpu-quick'}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"\nreceipt: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
