"""False alarms and detection delay of main's change-point detector, as the job uses it (bot/history/detect.py).

The job scans main's whole history of a gate again after every merge and keeps every change point it posts, so
a history where nothing changed counts as a false alarm when any of its scans finds a change. Printed, and
written as a receipt to bench/receipts/ (`--out`):
  - the share of A/A histories that alarm (Gaussian and Student-t(5) noise; lengths growing to 60 and to 120
    merges; no minimum step, the worst case: values are scaled by their own noise, so the level does not matter);
  - for planted steps (-3 % and -5 % at 1 % noise, after merge 30), the share found and the median number of
    merges after the step when it was first found.

    python scripts/history_false_alarm.py --histories 300
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.history import detect  # noqa: E402


def planted(histories: int, step: float, at: int, length: int, sigma: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    delays = []
    for _ in range(histories):
        x = 400.0 * np.exp(sigma * rng.standard_normal(length))
        x[at:] *= 1 + step
        hit = detect.first_alarm(list(x))
        if hit is not None:
            delays.append(hit - at)
    return {"step": step, "at_merge": at, "length": length, "sigma": sigma, "histories": histories,
            "found": len(delays) / histories, "median_merges_after": float(np.median(delays)) if delays else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--histories", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "receipts")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rec = {"kind": "history_false_alarm", "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "detector": {"penalty_per_log_n": detect.PENALTY_PER_LOG_N, "min_points": detect.MIN_POINTS,
                        "min_segment": detect.MIN_SEGMENT, "stated_rate": detect.FALSE_ALARM_RATE},
           "aa": [], "planted": []}
    for noise in ("gauss", "t"):
        for lengths in ((12, 60), (12, 120)):
            rate = detect.false_alarm_rate(a.histories, seed=a.seed, noise=noise, lengths=lengths)
            rec["aa"].append({"noise": noise, "lengths": list(lengths), "histories": a.histories, "rate": rate})
            print(f"A/A {noise:5} histories growing to {lengths[1]:3} merges: {rate:.2%} alarmed "
                  f"(stated at most {detect.FALSE_ALARM_RATE:.0%})", flush=True)
    for step in (-0.03, -0.05):
        r = planted(max(a.histories // 3, 30), step, 30, 60, 0.01, a.seed)
        rec["planted"].append(r)
        print(f"step {step:+.0%} after merge 30 at 1 % noise: found in {r['found']:.0%}, "
              f"median {r['median_merges_after']} merges after it", flush=True)
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"history-false-alarm-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(rec, indent=1))
    print(f"receipt: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
