"""Where the H200's decode A/A noise comes from (issue 13): fresh process pairs x per-step-logits modes.

    python bench/worker/decode_noise.py --out bench/receipts [--model qwen35-9b-q4_k_m] [--pairs 6] [--budget 300]

The calibration's fresh A/A pairs showed 9B decode pair-delta sd 0.9-1.9 % (0.8B 1.9-2.6 %), ~10x the
0.1 % one process pair showed with no per-step logits (gpu-calibration-standard-20261202T180713Z.json,
sandbox-gpu-20261202T072510Z.json). Two candidate causes: fresh processes differ (offsets no rep count
removes), or the copy of every step's logits (64 x 248k float32) inside each timed generate, through
pageable shared pages. This script tells them apart: each fresh pair of main runs the decode gates in
three modes, twice each, in rotated order:
  off       no per-step logits (what the sandbox check timed)
  pageable  per-step logits copied into the shared buffer as it is (page-faulting, staged copies)
  pinned    the same copy into rows page-locked for the GPU (worker/harness/driver.py pin_logits)
Per mode and gate: the across-pair sd of the pair delta (what calibration sees), the within-pair sd
(sweep 1 vs sweep 2 of one pair: what more reps inside a pair could remove) and the median timed
seconds (the copy's cost). The receipt has n, median and spread of everything it states.
`--variants cpus --prefill`: the same per pair with the revisions on every core vs both on one core
(pinned copies), the prefill gates up to 4k included.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.worker.sandbox_gpu_check import git_commit  # noqa: E402
from bench.tree_snapshot import REF, snapshot_commit  # noqa: E402
from worker import models as model_files  # noqa: E402
from worker import sandbox, telemetry  # noqa: E402
from worker.checkout import checkout_pair, remove_worktree  # noqa: E402
from worker.config import EvalSettings  # noqa: E402
from worker.gates.bench import gate_specs, run_sweep  # noqa: E402
from worker.pipeline import Evaluation, Job  # noqa: E402

MODES = ("off", "pageable", "pinned")
# --variants cpus: the 0.8B prefill 4k showed an A/A pair sd of 11.4 % on one card (1.6 % on another) while
# its pp512 is host-bound: the revisions on every core the worker has vs both on one core (pinned copies).
CPU_MODES = ("cpus_all", "cpus_one")


def pair_delta(base: list[float], head: list[float]) -> float:
    """log(median head / median base) of one sweep (tok/s values)."""
    return math.log(float(np.median(head)) / float(np.median(base)))


def sd_pct(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(100 * float(np.std(xs, ddof=1)), 4) if len(xs) > 1 else None


def summarize(rows: list[dict], gates: list[str]) -> dict:
    """rows: one per (pair, mode, sweep) with {gate: delta} and {gate: median seconds}."""
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        out[mode] = {}
        for g in gates:
            mine = [r for r in rows if r["mode"] == mode]
            pairs = sorted({r["pair"] for r in mine})
            per_pair = [[r["delta"][g] for r in mine if r["pair"] == p] for p in pairs]
            means = [float(np.mean(d)) for d in per_pair if d]
            within = [(d[0] - d[1]) / math.sqrt(2) for d in per_pair if len(d) == 2]  # sd of one sweep's delta
            secs = [r["seconds"][g] for r in mine]
            out[mode][g] = {
                "pairs": len(means),
                "across_pairs_sd_pct": sd_pct(means),  # sd of a pair's (2-sweep) mean delta
                "within_pair_sd_pct": round(100 * float(np.sqrt(np.mean(np.square(within)))), 4) if within else None,
                "median_timed_s": round(float(np.median(secs)), 5) if secs else None,
                "timed_s_spread": [round(float(np.min(secs)), 5), round(float(np.max(secs)), 5)] if secs else None,
                "pair_mean_deltas_pct": [round(100 * m, 4) for m in means],
            }
    return out


def run(model_name: str, n_pairs: int, budget_s: float, workdir: Path, reps: int, profile: str = "standard",
        variants: str = "copy", prefill: bool = False) -> dict:
    settings = EvalSettings(profile=profile, retries=0)
    prof = settings.profile_settings(profile)
    spec = next(m for m in prof.models if m.name == model_name)
    dc = spec.decode_contexts  # its shortest decode gate and 4k: the contexts calibration found noisiest
    spec = spec.model_copy(update={"decode_contexts": sorted({min(dc)} | ({4096} & set(dc))),
                                   "prefill_contexts": [c for c in spec.prefill_contexts if c <= 4096] if prefill else []})
    modes = MODES if variants == "copy" else CPU_MODES
    import os

    every_cpu, one_cpu = set(os.sched_getaffinity(0)), {max(os.sched_getaffinity(0))}
    snap = snapshot_commit(REPO)
    job = Job(repo=str(REPO), base_ref=REF, head_ref=REF, base_sha=snap, head_sha=snap, profile=profile,
              device=prof.device)
    ev = Evaluation(job, settings, workdir=workdir)
    ev.profile = ev.profile.model_copy(update={"models": [spec], "pairs": reps})
    p = ev.profile
    git_dir, base, head = checkout_pair(str(REPO), REF, REF, workdir, snap, snap)
    revs = {"base": base, "head": head}
    resolved = model_files.resolve(spec, ev.trusted_root, p.device)
    gates = gate_specs(spec, p)
    rows, loads, t0 = [], [], time.monotonic()
    try:
        for n in range(n_pairs):
            if n and time.monotonic() - t0 + (time.monotonic() - t0) / n > budget_s:
                break
            with ev.fresh_pair(revs, spec, resolved.path, n) as procs:
                vocab = procs["base"].vocab or 0
                loads.append({r: procs[r].hello.get("driver") for r in procs})
                k = n % len(modes)
                order = modes[k:] + modes[:k]  # rotate so drift inside a pair hits every mode alike
                for sweep in range(2):
                    for mode in order:
                        for r in procs:  # pin (or unpin) both sides' step-logits rows before this sweep
                            procs[r].request("pin_logits", rows=0 if mode in ("off", "pageable") else p.decode_tokens,
                                             phase="stage", timeout=60)
                            if mode in CPU_MODES:  # run_sweep moves each process tree onto this set first
                                procs[r].cpus = one_cpu if mode == "cpus_one" else every_cpu
                        sw = run_sweep(procs, gates, vocab=vocab, model_sha=resolved.sha256, pairs=reps,
                                       warmup=1 if (sweep == 0 and mode == order[0]) else 0,
                                       timeout=p.request_timeout_s, sweep_id=f"{n}{mode}{sweep}", clock=p.clock,
                                       step_logits=mode != "off", keep_steps=set())
                        rows.append({"pair": n, "mode": mode, "sweep": sweep,
                                     "delta": {g.name: pair_delta(sw.values("base", g.name), sw.values("head", g.name))
                                               for g in gates},
                                     "seconds": {g.name: float(np.median([s.seconds for r in ("base", "head")
                                                                          for s in sw.samples[(r, g.name)]]))
                                                 for g in gates}})
                print(f"pair {n}: " + ", ".join(f"{r['mode']}/{r['sweep']} "
                                               + " ".join(f"{100 * d:+.2f}%" for d in r["delta"].values())
                                               for r in rows if r["pair"] == n), flush=True)
    finally:
        for rev in revs.values():
            remove_worktree(git_dir, rev)
    pinned = [x.get("pinned") for x in getattr(ev, "_pair_loads", [])]
    return {"model": spec.name, "gguf_sha256": resolved.sha256, "gates": [g.name for g in gates], "rows": rows,
            "summary": summarize(rows, [g.name for g in gates]), "pinned_at_load": pinned[:4], "variants": variants,
            "config": p.model_dump(include={"device", "backend", "pairs", "inner", "clock", "decode_tokens", "cpus"}),
            "seconds": round(time.monotonic() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "bench" / "receipts"))
    ap.add_argument("--model", action="append", help="model of the standard profile (repeatable)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--reps", type=int, default=4, help="ABBA reps per sweep (the standard profile's pairs)")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds per model")
    ap.add_argument("--profile", default="standard", help="quick: a CPU smoke run of this script")
    ap.add_argument("--variants", choices=["copy", "cpus"], default="copy",
                    help="copy: off / pageable / pinned per-step logits; cpus: every core vs one (pinned copies)")
    ap.add_argument("--prefill", action="store_true", help="time the model's prefill gates up to 4k too")
    args = ap.parse_args(argv)
    iso = sandbox.detect_isolation()
    if not iso.full:
        print(f"full sandbox unavailable: {iso.reason}", file=sys.stderr)
        return 2
    results = []
    for name in args.model or ["qwen35-9b-q4_k_m"]:
        with tempfile.TemporaryDirectory() as tmp:
            results.append(run(name, args.pairs, args.budget, Path(tmp) / "w", args.reps, args.profile,
                               args.variants, args.prefill))
        print(json.dumps({results[-1]["model"]: results[-1]["summary"]}, indent=1), flush=True)
    stamp = dt.datetime.now(dt.timezone.utc)
    receipt = {"kind": "decode_noise", "created": stamp.isoformat(timespec="seconds"), "commit": git_commit(),
               "host": telemetry.host_facts(EvalSettings(profile=args.profile).profile_settings(args.profile).device), "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"decode-noise-{stamp:%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(receipt, indent=1, default=str))
    print(f"receipt {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
