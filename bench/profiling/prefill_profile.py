"""Where a short prefill's time goes (issue 17: pp512 >= 1.5x llama.cpp is a fixed per-call cost problem).

    python bench/profiling/prefill_profile.py --shape 27b --quant q4_k_m --length 512 [--out DIR]
    python bench/profiling/prefill_profile.py --device cpu --shape tiny --length 32     # smoke run (interpreter)
    python bench/profiling/prefill_profile.py --gguf /var/tmp/moe/qwen35moe-35b-a3b-q4_k_m-seed0.gguf --shape 35b-a3b
                                              # a file made before (the MoE's takes minutes to make)

One warm prefill of `--length` tokens under torch.profiler, after `--warmup` untimed ones. Prints and
writes (prefill-profile-<shape>-<utc>.json): the call's wall time, the GPU's busy time (union of kernel
intervals) and so its idle share, kernel launches, host<->device copies and synchronisations, and
the kernels that take the most time grouped by name. Wall minus busy is what launches, host syncs
and Python cost: the part a fixed-cost fix (fewer launches, no scratch dequantization per call, no
host syncs, a CUDA graph) can win back.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.tree_snapshot import snapshot_commit  # noqa: E402
from runtime.gguf.writer import file_sha256  # noqa: E402


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (overlapping kernels on several streams count once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def receipt_path(out: str, name: str) -> Path:
    """A new receipt's path under `out` (made if missing): `<name>-<utc stamp>.json`."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{name}-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"


def summarize(events, wall_s: float, top: int = 15) -> dict:
    """Kernel and runtime-call figures from a profiler's events (times in microseconds there)."""
    kernels, by_name, calls = [], defaultdict(lambda: [0, 0.0]), defaultdict(int)
    for e in events:
        dev = getattr(e, "device_type", None)
        if dev is not None and dev.name == "CUDA" and e.time_range.elapsed_us() >= 0:
            kernels.append((e.time_range.start / 1e6, e.time_range.end / 1e6))
            rec = by_name[e.name[:120]]
            rec[0] += 1
            rec[1] += e.time_range.elapsed_us() / 1e6
        elif e.name.startswith(("cuda", "cu")):  # runtime/driver API calls on the host
            calls[e.name] += 1
    busy = busy_seconds(kernels)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "wall_s": wall_s,
        "gpu_busy_s": busy if kernels else None,
        "gpu_idle_share": (1 - busy / wall_s) if kernels and wall_s > 0 else None,
        "kernel_launches": len(kernels) if kernels else None,
        "reason": None if kernels else "no CUDA kernel events (CPU run or profiler without CUPTI)",
        "syncs": sum(v for k, v in calls.items() if "Synchronize" in k),
        "copies": sum(v for k, v in calls.items() if "Memcpy" in k),
        "launch_calls": sum(v for k, v in calls.items() if "LaunchKernel" in k or k == "cuLaunchKernel"),
        "runtime_calls": dict(sorted(calls.items(), key=lambda kv: -kv[1])[:12]),
        "top_kernels": [{"name": k, "count": c, "seconds": round(s, 6), "share_of_busy": (s / busy) if busy else None}
                        for k, (c, s) in ranked],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="0.8b")
    ap.add_argument("--quant", default="q4_k_m")
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="timed prefills without the profiler (median)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gguf", help="profile this file instead of making the synthetic --shape/--quant one")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "receipts"))
    a = ap.parse_args(argv)
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from runtime import load_engine
    from worker.models import make_synth

    if a.gguf and not Path(a.gguf).is_file():
        raise SystemExit(f"--gguf {a.gguf}: no such file")
    path = Path(a.gguf) if a.gguf else make_synth({"shape": a.shape, "quant": a.quant, "seed": 0}, REPO,
                                                  device=a.device)
    eng = load_engine(str(path), device=a.device, max_context=a.length + 8,
                      backend="triton" if a.device.startswith("cuda") else "auto")
    ids = torch.randint(0, eng.config.vocab_size, (a.length,), generator=torch.Generator().manual_seed(0))

    def one() -> float:
        eng.reset()
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        eng.prefill(ids)
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t

    for _ in range(a.warmup):
        one()
    plain = [one() for _ in range(a.repeats)]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        wall = one()
    rec = {"kind": "prefill_profile", "shape": a.shape, "quant": a.quant, "length": a.length, "device": a.device,
           "gguf": path.name, "ttft_median_s": statistics.median(plain), "ttft_s": plain,
           "tok_s_median": a.length / statistics.median(plain),
           "profiled": summarize(prof.events(), wall),
           "n": a.repeats, "spread": (max(plain) - min(plain)) / statistics.median(plain),
           "gguf_sha256": file_sha256(path), "commit": snapshot_commit(REPO),
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
           "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    target = receipt_path(a.out, f"prefill-profile-{a.shape}-{a.quant}-{a.length}")
    target.write_text(json.dumps(rec, indent=1))
    p = rec["profiled"]
    print(f"pp{a.length} {a.shape}: TTFT {rec['ttft_median_s'] * 1e3:.1f} ms (median of {a.repeats}); profiled wall "
          f"{p['wall_s'] * 1e3:.1f} ms, GPU busy {p['gpu_busy_s'] and p['gpu_busy_s'] * 1e3}, launches "
          f"{p['kernel_launches']}, syncs {p['syncs']}, copies {p['copies']}")
    for k in p["top_kernels"][:8]:
        print(f"  {k['seconds'] * 1e3:8.2f} ms  x{k['count']:<5} {k['name'][:80]}")
    print(f"receipt: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
