"""Time the synthetic-model factory on the GPU box: one JSON line per shape.

    python3 bench/runtime/synth_time.py [--shapes 0.8b,4b,9b] [--quant q4_k_m] [--workers N] [--dir /tmp/synth_time]

Each line: shape, quant, seconds (whole `synthesize` call, sha256 included), bytes, sha256,
workers, device, torch_threads (the basis QRs' result depends on it), and the per-stage
seconds (stream.Timings).  --check-workers N writes each file again with N workers and adds
whether the sha256 is the same.  Files are deleted unless --keep.
Needs torch, numpy and the `gguf` package (the factory imports nothing else).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from runtime.synth.factory import default_workers, synthesize  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="0.8b,4b,9b")
    ap.add_argument("--quant", default="q4_k_m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dir", default="/tmp/synth_time")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--check-workers", type=int, default=0, metavar="N")
    args = ap.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes.split(","):
        path = work / f"synth-{shape}-{args.quant}-seed{args.seed}.gguf"
        t0 = time.perf_counter()
        r = synthesize(shape, args.quant, args.seed, path, device=args.device, workers=args.workers)
        seconds = time.perf_counter() - t0
        line = {"shape": shape, "quant": args.quant, "seconds": round(seconds, 2), "bytes": r.nbytes, "sha256": r.sha256,
                "workers": args.workers, "device": args.device, "torch_threads": torch.get_num_threads(), "stages": r.timings}
        if args.check_workers:
            again = synthesize(shape, args.quant, args.seed, path, device=args.device, workers=args.check_workers)
            line[f"same_sha_with_{args.check_workers}_workers"] = again.sha256 == r.sha256
        print(json.dumps(line), flush=True)
        if not args.keep:
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
