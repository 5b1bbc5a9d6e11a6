"""GPU check of the evaluation pipeline (run by the coordinator on a CUDA box).

    python bench/worker/worker_gpu_eval.py --out "$OUT" [--profile standard] [--runs 3]

1. A/A calibration of this checkout on the profile (records the GPU's per-gate noise).
2. One A/A evaluation of this checkout (expected: none, all guards pass, bit-identical).
3. The demo PR (decode does its work twice) on the GPU with backend=reference (expected: REJECT
   naming decode gates).
Writes calibration.json, aa/{comment.md,receipt.json}, demo/{comment.md,receipt.json} under --out
and prints the wall time of each step. Needs the synthetic model factory for the real shapes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402

from worker.cli import calibrate, make_demo_repo, run_eval  # noqa: E402
from worker.config import EvalSettings  # noqa: E402
from worker.pipeline import Job  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="standard")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENGATE_CACHE_DIR", str(out / "cache"))
    console = Console(width=160)
    settings = EvalSettings(profile=args.profile, retries=0)
    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(repo)], check=True)
        t = time.monotonic()
        summary = calibrate(str(repo), "HEAD", settings, runs=args.runs, device=args.device)
        times["calibrate_s"] = time.monotonic() - t
        (out / "calibration.json").write_text(json.dumps(summary, indent=2))
        console.print(summary)
        t = time.monotonic()
        r = run_eval(Job(repo=str(repo), base_ref="HEAD", head_ref="HEAD", profile=args.profile, device=args.device),
                     settings, out / "aa", console)
        times["aa_eval_s"] = time.monotonic() - t
        demo_repo, base, head = make_demo_repo(Path(tmp) / "demo")
        demo_settings = settings.with_profile(args.profile, backend="reference")
        t = time.monotonic()
        d = run_eval(Job(repo=str(demo_repo), base_ref=base, head_ref=head, profile=args.profile,
                         device=args.device), demo_settings, out / "demo", console)
        times["demo_eval_s"] = time.monotonic() - t
    print(json.dumps({"aa_verdict": r.verdict.value, "demo_verdict": d.verdict.value, **times}, indent=1))
    (out / "times.json").write_text(json.dumps(times, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
