"""Where one decode token's time goes (issue 17: 4B decode 1.06x llama.cpp, 9B 325.8 of >= 418 tok/s).

    python bench/profiling/decode_profile.py --shape 4b --shape 9b [--quant q4_k_m] [--out DIR]
    python bench/profiling/decode_profile.py --device cpu --shape tiny --steps 2      # smoke run (interpreter)

Per shape: the served step (CUDA graph) timed over `--tokens` greedy tokens (median of `--repeats`),
then `--steps` eager steps under torch.profiler. Writes decode-profile-<shapes>-<utc>.json with, per
shape: tok/s and ms per token from the graph, the eager step's GPU busy time, and every kernel of
one step in launch order with its duration, so each GEMV can be matched to its matrix (the order
is DecodeStep's: runtime/triton/decode.py) and its achieved bandwidth read off: the weights'
bytes are listed in the same order (`weights_in_order`). The GPU time by kernel name is summed too.
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

from bench.profiling.prefill_profile import busy_seconds, receipt_path  # noqa: E402
from bench.tree_snapshot import snapshot_commit  # noqa: E402
from runtime.gguf.writer import file_sha256  # noqa: E402


def kernels_of(events) -> list[tuple[float, float, str]]:
    """(start s, duration s, name) of every GPU kernel the profiler saw, in start order."""
    out = []
    for e in events:
        dev = getattr(e, "device_type", None)
        if dev is not None and dev.name == "CUDA" and e.time_range.elapsed_us() >= 0:
            out.append((e.time_range.start / 1e6, e.time_range.elapsed_us() / 1e6, e.name[:100]))
    return sorted(out)


def per_step(kernels: list[tuple[float, float, str]], steps: int) -> list[dict]:
    """The last step's kernels in order (the profiled steps launch the same sequence)."""
    if not kernels or steps < 1 or len(kernels) % steps:
        return []
    n = len(kernels) // steps
    return [{"i": i, "us": round(d * 1e6, 2), "name": name} for i, (_, d, name) in enumerate(kernels[-n:])]


def by_name(kernels: list[tuple[float, float, str]], steps: int) -> list[dict]:
    agg = defaultdict(lambda: [0, 0.0])
    for _, d, name in kernels:
        agg[name][0] += 1
        agg[name][1] += d
    return [{"name": k, "per_step": c / steps, "us_per_step": round(s / steps * 1e6, 2)}
            for k, (c, s) in sorted(agg.items(), key=lambda kv: -kv[1][1])]


def weights_in_order(eng) -> list[dict]:
    """The matrices a decode step reads, with their bytes and type, in file order (the step's order by layer)."""
    return [{"name": n, "type": getattr(w.qtype, "name", str(w.qtype)), "bytes": int(w.nbytes),
             "shape": [int(w.rows), int(w.cols)] if hasattr(w, "rows") else None}
            for n, w in eng.weights.mat.items()]


def profile_shape(shape: str, a) -> dict:
    from runtime import load_engine

    cuda = a.device.startswith("cuda")
    if cuda and a.quant == "q4_k_m":  # the very file bench/runtime/decode.py and gemv_sweep.py time
        from bench.runtime.decode import make_model
        path = make_model(shape, REPO / ".cache" / "bench", seed=0)
    else:
        from worker.models import make_synth
        path = make_synth({"shape": shape, "quant": a.quant, "seed": 0}, REPO, device=a.device)
    rec = {"gguf": path.name, "gguf_sha256": file_sha256(path)}
    eng = load_engine(str(path), device=a.device, max_context=a.depth + a.tokens * (a.repeats + 2) + 64,
                      backend="triton")  # on the CPU: the Triton kernels under the interpreter
    ids = torch.randint(0, eng.config.vocab_size, (max(a.depth, 1),), generator=torch.Generator().manual_seed(0))
    eng.prefill(ids)
    start = eng.position
    eng.generate_greedy(4)  # graph capture
    tok_s = []
    for _ in range(a.repeats):
        eng.position = start
        eng.state.pos.fill_(start)
        eng.synchronize()
        t = time.perf_counter()
        eng.generate_greedy(a.tokens)
        eng.synchronize()
        tok_s.append(a.tokens / (time.perf_counter() - t))
    med = statistics.median(tok_s)
    rec.update(depth=a.depth, tokens=a.tokens, n=a.repeats, tok_s=tok_s, tok_s_median=med, ms_per_token=1e3 / med,
               spread=(max(tok_s) - min(tok_s)) / med)
    step = eng.step  # the eager launch sequence the graph replays
    for _ in range(2):
        step()
    eng.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(a.steps):
            step()
        eng.synchronize()
    ks = kernels_of(prof.events())
    rec["eager"] = {
        "steps": a.steps,
        "kernels_per_step": len(ks) / a.steps if ks else None,
        "gpu_busy_ms_per_step": busy_seconds([(s, s + d) for s, d, _ in ks]) / a.steps * 1e3 if ks else None,
        "reason": None if ks else "no CUDA kernel events (CPU run or profiler without CUPTI)",
        "by_name": by_name(ks, a.steps),
        "one_step": per_step(ks, a.steps),
    }
    rec["weights_in_order"] = weights_in_order(eng)
    rec["config"] = {k: getattr(eng.config, k) for k in ("n_layers", "d_model", "d_ffn", "vocab_size",
                                                         "tied_embeddings")}
    del eng
    if cuda:
        torch.cuda.empty_cache()
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", action="append", default=None)
    ap.add_argument("--quant", default="q4_k_m")
    ap.add_argument("--depth", type=int, default=16, help="prompt tokens before decoding")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="eager steps under the profiler")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "receipts"))
    a = ap.parse_args(argv)
    shapes = a.shape or ["4b", "9b"]
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    rec = {"kind": "decode_profile", "quant": a.quant, "device": a.device, "commit": snapshot_commit(REPO),
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
           "driver": None, "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "shapes": {}}
    if a.device.startswith("cuda"):
        try:
            import pynvml
            pynvml.nvmlInit()
            rec["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception as exc:  # noqa: BLE001 - the receipt says why it is missing
            rec["driver"] = None
            rec["driver_reason"] = f"{type(exc).__name__}: {exc}"
    target = receipt_path(a.out, f"decode-profile-{'_'.join(shapes)}-{a.quant}")
    for shape in shapes:
        try:
            rec["shapes"][shape] = profile_shape(shape, a)
        except Exception as exc:  # noqa: BLE001 - one shape's failure is recorded, the rest still run
            rec["shapes"][shape] = {"error": f"{type(exc).__name__}: {exc}"}
        target.write_text(json.dumps(rec, indent=1))
        r = rec["shapes"][shape]
        if "error" in r:
            print(f"{shape}: {r['error']}")
            continue
        e = r["eager"]
        print(f"{shape}: graph {r['tok_s_median']:.1f} tok/s ({r['ms_per_token']:.3f} ms/token, spread "
              f"{r['spread'] * 100:.2f} %); eager step GPU busy {e['gpu_busy_ms_per_step']} ms, "
              f"{e['kernels_per_step']} kernels")
        for k in e["by_name"][:8]:
            print(f"  {k['us_per_step']:9.1f} us  x{k['per_step']:<5g} {k['name'][:80]}")
    print(f"receipt: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
