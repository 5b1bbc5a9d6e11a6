"""GPU receipt for the hardened sandbox (issue 14 item 8), run by the lead on a CUDA box.

    python bench/worker/sandbox_gpu_check.py --out bench/receipts [--sweeps 4] [--pairs 4]

Starts base and head of THIS checkout (A/A) in the full sandbox (bwrap uid 65534, seccomp,
cgroup limits), loads the 0.8B model with the Triton backend, records what the sandbox really
enforced (CapEff/NoNewPrivs/Seccomp seen inside, host uid, cgroup limits read back), then times
the speed gates in alternating sweeps WITH and WITHOUT freezing the idle revision. Each sweep
gives one A/A delta per gate (log ratio of head/base medians); the receipt has n, median and
spread of |delta| per gate and mode, so one can see freezing does not make the noise worse.
Fails (exit 2) when the full sandbox is not available: no receipt from a weaker one.
Budget: ~4 min on an H200 (two loads of the 0.8B model + 2 x sweeps x pairs ABBA rounds).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.tree_snapshot import REF, snapshot_commit  # noqa: E402
from worker import sandbox, telemetry  # noqa: E402
from worker.checkout import checkout_pair, remove_worktree  # noqa: E402
from worker.config import EvalSettings, ModelSpec  # noqa: E402
from worker.gates.bench import gate_specs, run_sweep  # noqa: E402
from worker.gates.idle_gpu import IdleGpuCheck  # noqa: E402
from worker.pipeline import Evaluation, Job  # noqa: E402


def aa_delta(base: list[float], head: list[float]) -> float:
    """One sweep's A/A delta of a gate: log(median head / median base)."""
    return math.log(float(np.median(head)) / float(np.median(base)))


def summarize(deltas: dict[str, dict[str, list[float]]]) -> dict:
    """{mode: {gate: [delta per sweep]}} -> n, median |delta|, spread (std of deltas), in percent."""
    out = {}
    for mode, gates in deltas.items():
        out[mode] = {}
        for gate, ds in gates.items():
            a = np.abs(np.asarray(ds, dtype=float))
            out[mode][gate] = {
                "n": len(ds),
                "median_abs_delta_pct": round(100 * float(np.median(a)), 4) if len(ds) else None,
                "spread_pct": round(100 * float(np.std(ds, ddof=1)), 4) if len(ds) > 1 else None,
                "deltas_pct": [round(100 * d, 4) for d in ds],
            }
    return out


def noise_not_worse(summary: dict, slack: float = 1.5) -> dict:
    """Per gate: is the frozen mode's spread within `slack` x the unfrozen one? (None = not measurable)."""
    res = {}
    for gate, f in summary.get("freeze", {}).items():
        u = summary.get("no_freeze", {}).get(gate, {})
        if f.get("spread_pct") is None or u.get("spread_pct") is None:
            res[gate] = None
        else:
            res[gate] = f["spread_pct"] <= slack * max(u["spread_pct"], 1e-6)
    return res


def git_commit() -> str | None:
    p = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or None


def measure(repo: Path, model: ModelSpec, device: str, backend: str, sweeps: int, pairs: int, workdir: Path,
            settings: EvalSettings, profile_name: str) -> dict:
    snap = snapshot_commit(repo)  # the working tree, not the device checkout's last landed commit
    job = Job(repo=str(repo), base_ref=REF, head_ref=REF, profile=profile_name, device=device)
    ev = Evaluation(job, settings, workdir=workdir)
    p = ev.profile.model_copy(update={"backend": backend, "pairs": pairs, "models": [model]})
    ev.profile = p
    git_dir, base, head = checkout_pair(str(repo), REF, REF, workdir, snap, snap)
    ev.revs = {"base": base, "head": head}
    from worker import models as model_files

    resolved = model_files.resolve(model, ev.trusted_root, device)
    procs = ev.make_procs(ev.revs, [resolved.path])
    procs.pop("reference").__exit__(None, None, None)
    gates = gate_specs(model, p)
    deltas = {"freeze": {g.name: [] for g in gates}, "no_freeze": {g.name: [] for g in gates}}
    idle_receipts = []
    try:
        for r in ("base", "head"):
            procs[r].start(p.load_timeout_s)
        t = time.monotonic()
        for r in ("base", "head"):
            procs[r].begin("load", path=str(resolved.path), device=device, max_context=p.max_context(model),
                           backend=backend)
        vocab = [procs[r].finish(phase="load", timeout=p.load_timeout_s)[0]["vocab_size"] for r in ("base", "head")][0]
        load_s = time.monotonic() - t
        for i in range(2 * sweeps):  # alternate the modes so drift hits both alike
            mode = "freeze" if i % 2 == 0 else "no_freeze"
            # Frozen sweeps also run the NVML idle-kernel check (worker/gates/idle_gpu.py): its receipt says
            # whether the frozen revision ever showed SM activity in the other's timed window.
            idle = IdleGpuCheck(telemetry.nvml(telemetry.device_index(device)), p.idle_gpu_settle_s)
            sw = run_sweep(procs, gates, vocab=vocab, model_sha=resolved.sha256, pairs=pairs, warmup=1 if i < 2 else 0,
                           timeout=p.request_timeout_s, inner=p.inner, sweep_id=i, clock=p.clock,
                           freeze=mode == "freeze", idle_check=idle.check if mode == "freeze" else None,
                           step_logits=p.decode_step_logits, keep_steps=set())
            if mode == "freeze":
                idle_receipts.append({**idle.receipt(), "voided": sw.idle_voids})
            for g in gates:
                deltas[mode][g.name].append(aa_delta(sw.values("base", g.name), sw.values("head", g.name)))
        iso = {r: procs[r].isolation for r in ("base", "head")}
    finally:
        for q in procs.values():
            q.close()
        for rev in (base, head):
            remove_worktree(git_dir, rev)
    return {"deltas": deltas, "isolation": iso, "load_s": round(load_s, 2), "idle_gpu": idle_receipts,
            "gates": [g.name for g in gates], "profile": p.model_dump(include={"device", "backend", "pairs", "inner",
                                                                               "clock", "decode_tokens", "cpus"})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "bench" / "receipts"))
    ap.add_argument("--profile", default="standard")
    ap.add_argument("--model", default=None, help="model name in the profile (default: its 0.8B primary)")
    ap.add_argument("--gates", default="decode@128,decode@512,prefill@512")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default=None)
    ap.add_argument("--sweeps", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--repo", default=str(REPO))
    args = ap.parse_args(argv)
    iso = sandbox.detect_isolation()
    if not iso.full:
        print(f"full sandbox unavailable: {iso.reason}", file=sys.stderr)
        return 2
    settings = EvalSettings(profile=args.profile, retries=0)
    prof = settings.profile_settings(args.profile)
    model = next(m for m in prof.models if (m.name == args.model if args.model else m.role == "primary"))
    wanted = set(args.gates.split(","))
    model = model.model_copy(update={
        "decode_contexts": [c for c in model.decode_contexts if f"decode@{c}" in wanted],
        "prefill_contexts": [c for c in model.prefill_contexts if f"prefill@{c}" in wanted]})
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        m = measure(Path(args.repo), model, args.device, args.backend or prof.backend, args.sweeps, args.pairs,
                    Path(tmp) / "w", settings, args.profile)
    summary = summarize(m["deltas"])
    receipt = {
        "kind": "sandbox_gpu_check", "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "host": telemetry.host_facts(args.device), "model": model.name,
        "config": {**m["profile"], "sweeps_per_mode": args.sweeps, "gates": m["gates"]},
        "sandbox": {"probe": iso.to_dict(), "per_process": m["isolation"]},
        "load_s": m["load_s"], "noise": summary, "freeze_noise_not_worse": noise_not_worse(summary),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"sandbox-gpu-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(receipt, indent=2, default=str))
    print(json.dumps({"receipt": str(path), "noise": summary, "not_worse": receipt["freeze_noise_not_worse"],
                      "CapEff": iso.facts.get("CapEff"), "wall_s": receipt["wall_s"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
