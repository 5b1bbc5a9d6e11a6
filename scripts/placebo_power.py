"""Placebo and power of the speed gates, through the project's own gate_null / compare_pairs / decide.

`simulate` (default): realistic noise — per process pair a speed offset (sd `--offset`), per rep an
ABBA log-ratio noise (sd `--rep`) — is calibrated at 1x and then judged on a host 1x / 1.5x / 2x
noisier, exactly as an evaluation does it (first pair, more pairs while a gate stays beyond its floor,
the interval over process pairs, the verdict rules). Printed per noise setting:
  - false significance per A/A evaluation (any gate significant), the bound it is held to, and with
    the drift test (the worker's newest A/A pairs from the noisier host in the history): how often the
    drift is caught (the gates then say "uncalibrated" instead of judging) and the combined rate;
  - detection of planted 1 / 2 / 5 % slowdowns on one decode gate, and the minimum detectable change
    (90 % detection) calibrated and uncalibrated.
`cpu-placebo`: a real A/A placebo run of the quick profile on this CPU (worker/calibration/placebo.py),
printing its counts and the bound.

Both write a receipt to bench/receipts/ (`--out`).

    python scripts/placebo_power.py simulate --trials 4000
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

from worker.calibration.history import drift_p  # noqa: E402
from worker.config import EvalSettings  # noqa: E402
from worker.gates.noise import gate_null, history_needed  # noqa: E402
from worker.gates.stats import compare_pairs  # noqa: E402
from worker.records import GateResult, Verdict  # noqa: E402
from worker.verdict import decide  # noqa: E402

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


def simulate(args) -> dict:
    s = EvalSettings()
    rng = np.random.default_rng(args.seed)
    out = {"kind": "placebo_power_simulation", "gates": GATES, "false_significance_rate": s.false_significance_rate,
           "reps": args.reps, "max_pairs": args.max_pairs, "history": args.history, "trials": args.trials,
           "histories": args.histories, "settings": []}
    need = history_needed(s.false_significance_rate / len(GATES) / 2, args.max_pairs)
    for offset, rep in args.noise:
        row = {"offset_sd": offset, "rep_sd": rep, "history_needed": need, "false": {}, "detect": {}, "mdc": {}}
        t0 = time.monotonic()
        for k in (1.0, 1.5, 2.0):
            hits = hits_dt = said_uncal = flagged = harm = 0
            evals = 0
            bound = None
            for h in range(args.histories):
                cal = Host(offset, rep, args.reps, rng)
                hist = calibration(cal, args.history)
                nulls = nulls_from(hist, s, args.max_pairs)
                bound = sum(n.bound for n in nulls.values())
                host = Host(offset * k, rep * k, args.reps, rng)
                # the drift test on the worker's newest A/A pairs (sentinels) from this host, per gate, as
                # worker/calibration/history.py runs it: a flagged gate is uncalibrated until rebuilt
                recent = calibration(host, s.drift_window)
                rate = s.false_significance_rate / len(GATES)
                from scipy import stats as _st

                pooled = float(_st.combine_pvalues([_st.mannwhitneyu(np.abs(recent[g]), np.abs(hist[g]),
                                                                     alternative="greater").pvalue for g in GATES],
                                                   method="fisher").pvalue)
                tested = {g: (gate_null(recent[g], per_gate_rate=rate, minimum=s.noise_floor_min,
                                        max_pairs=args.max_pairs, uncalibrated_floor=s.noise_floor_uncalibrated,
                                        state="drift", reason="drift")
                              if min(drift_p(recent[g], hist[g]), pooled) < s.drift_alpha else nulls[g])
                          for g in GATES}
                flagged += sum(not tested[g].calibrated for g in GATES)
                for _ in range(args.trials // args.histories):
                    _d, _g = judge(host, nulls, s, {})
                    hits += any(g.significant for g in _g)
                    d2, g2 = judge(host, tested, s, {})
                    hits_dt += any(g.significant for g in g2)
                    harm += d2.verdict not in (Verdict.NONE, Verdict.UNCALIBRATED)
                    said_uncal += d2.verdict is Verdict.UNCALIBRATED
                    evals += 1
            row["false"][f"{k}x"] = {"false_significance_per_evaluation": hits / evals, "evaluations": evals,
                                     "significant_evaluations": hits, "bound_claimed": bound,
                                     "gates_flagged_by_drift_test": flagged / (args.histories * len(GATES)),
                                     "with_drift_test": hits_dt / evals, "said_uncalibrated": said_uncal / evals,
                                     # a false REJECT / mixed / tier with the drift test in place
                                     "false_verdict_with_drift_test": harm / evals}
        # detection at 1x, calibrated, and uncalibrated (no history)
        for label, n_hist in (("calibrated", args.history), ("uncalibrated", 0)):
            cal = Host(offset, rep, args.reps, rng)
            nulls = nulls_from(calibration(cal, n_hist), s, args.max_pairs)
            host = Host(offset, rep, args.reps, rng)

            def rate(change, trials=args.power_trials):
                det = 0
                for _ in range(trials):
                    d, gates = judge(host, nulls, s, {"decode@512": change})
                    det += any(g.regression and g.gate == "decode@512" for g in gates)
                return det / trials

            row["detect"][label] = {f"{int(p * 100)}%": rate(-p) for p in (0.01, 0.02, 0.05)}
            grid = [0.0025 * i for i in range(1, 81)]
            lo, hi = 0, len(grid) - 1
            while lo < hi:  # smallest planted slowdown detected >= 90 % (detection grows with size)
                mid = (lo + hi) // 2
                if rate(-grid[mid], args.power_trials // 2) >= 0.9:
                    hi = mid
                else:
                    lo = mid + 1
            while lo < len(grid) - 1 and rate(-grid[lo]) < 0.9:  # confirm with the full trial count
                lo += 1
            row["mdc"][label] = grid[lo] if rate(-grid[lo]) >= 0.9 else None  # None: above the grid (20 %)
        row["seconds"] = round(time.monotonic() - t0, 1)
        out["settings"].append(row)
        print_row(row)
    return out


def print_row(row):
    print(f"\nnoise: process offset sd {row['offset_sd']:.2%}, rep sd {row['rep_sd']:.2%} "
          f"(history needed {row['history_needed']} A/A pairs)")
    for k, f in row["false"].items():
        print(f"  host {k:>4}: false significance/eval {f['false_significance_per_evaluation']:.2e} "
              f"({f['significant_evaluations']}/{f['evaluations']}), bound {f['bound_claimed']:.1e}; with the drift "
              f"test {f['with_drift_test']:.2e} (gates flagged {f['gates_flagged_by_drift_test']:.0%}, "
              f"evaluations said uncalibrated {f['said_uncalibrated']:.0%}; false REJECT/mixed/tier "
              f"{f['false_verdict_with_drift_test']:.2e})")
    for label, d in row["detect"].items():
        mdc = row["mdc"][label]
        print(f"  {label:>12}: detect 1% {d['1%']:.0%}  2% {d['2%']:.0%}  5% {d['5%']:.0%}   "
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
           "noise": rep.noise_table(), "process_pairs": rep.process_pairs}
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
    a.add_argument("--trials", type=int, default=4000, help="A/A evaluations per host-noise factor")
    a.add_argument("--histories", type=int, default=40, help="independent calibration draws")
    a.add_argument("--history", type=int, default=40, help="A/A pairs per gate at calibration")
    a.add_argument("--power-trials", type=int, default=200)
    a.add_argument("--reps", type=int, default=5)
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
