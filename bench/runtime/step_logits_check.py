"""GPU check of the per-step logits path (issue 13 item 6): the Triton engine's graph-captured
generate_greedy fills `logits_out`, and those rows equal what step-by-step decode gives.

    python bench/runtime/step_logits_check.py [--shape tiny|0.8b] [--tokens 64] [--context 512]

Prints ids agreement, the max |difference| of the rows against eager decode steps, and the time of
generate_greedy(n) with and without logits_out (+ the driver's copy into shared memory), median of 10.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from runtime import load_engine  # noqa: E402
from worker.models import make_synth  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--quant", default="q8_0")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--context", type=int, default=512)
    a = ap.parse_args()
    path = make_synth({"shape": a.shape, "quant": a.quant, "seed": 0}, REPO, device="cuda")
    eng = load_engine(str(path), device="cuda", max_context=a.context + a.tokens + 8, backend="triton")
    V = eng.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (a.context,), generator=g)

    def run(out):
        eng.reset()
        eng.prefill(ids)
        torch.cuda.synchronize()
        t = time.perf_counter()
        got = eng.generate_greedy(a.tokens, logits_out=out) if out is not None else eng.generate_greedy(a.tokens)
        if out is not None:
            put(out)  # what the driver adds inside the timed request: into the parent's shared memory
        torch.cuda.synchronize()
        return got, time.perf_counter() - t

    import mmap
    import os

    from worker.harness.driver import Driver

    cap = a.tokens * V * 4
    fd = os.memfd_create("step-logits-check")
    os.ftruncate(fd, cap)
    put = Driver(REPO, mmap.mmap(fd, cap, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))._put
    buf = torch.full((a.tokens, V), float("nan"), device="cuda")
    plain, _ = run(None)
    filled, _ = run(buf)
    eng.reset()
    eng.prefill(ids)
    eager = torch.stack([eng.decode(t).float().reshape(-1) for t in filled])
    times = {"plain": [], "logits_out": []}
    for _ in range(10):
        times["plain"].append(run(None)[1])
        times["logits_out"].append(run(buf)[1])
    rec = {"shape": a.shape, "vocab": V, "tokens": a.tokens, "context": a.context,
           "ids_equal": plain == filled, "rows_finite": bool(torch.isfinite(buf).all()),
           "max_abs_diff_vs_eager_decode": float((buf - eager).abs().max()),
           "median_s": {k: statistics.median(v) for k, v in times.items()}}
    rec["overhead"] = rec["median_s"]["logits_out"] / rec["median_s"]["plain"] - 1
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
