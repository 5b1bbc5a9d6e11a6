"""Where a fresh process's model load goes (issue 19: ~18 s of `load_engine` unattributed).

    python bench/runtime/load_profile.py --shape 0.8b --quant q8_0 [--max-context 4096] [--out DIR]

Makes (or finds) the synthetic model, then in a fresh process times CUDA's own start apart from
`load_engine` and profiles the load with cProfile: the top functions by cumulative and by own
time go to stdout and, with --out, to DIR/load-profile-<shape>.txt.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

CHILD = r"""
import cProfile, io, pstats, sys, time
t = time.perf_counter()
import torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
t_cuda = time.perf_counter() - t
import runtime
path, max_ctx = sys.argv[1], int(sys.argv[2])
prof = cProfile.Profile()
t = time.perf_counter()
prof.enable()
eng = runtime.load_engine(path, device="cuda", max_context=max_ctx, backend="triton")
torch.cuda.synchronize()
prof.disable()
t_load = time.perf_counter() - t
t = time.perf_counter()
eng.prefill(list(range(1, 257))); eng.generate_greedy(16); eng.synchronize()
t_first = time.perf_counter() - t
print(f"cuda_init_s {t_cuda:.2f}  load_engine_s {t_load:.2f}  first_request_s {t_first:.2f}")
for key in ("cumulative", "tottime"):
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(key).print_stats(30)
    print(s.getvalue())
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="0.8b")
    ap.add_argument("--quant", default="q8_0")
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from worker.models import make_synth

    path = make_synth({"shape": args.shape, "quant": args.quant, "seed": 0}, REPO, device="cuda")
    p = subprocess.run([sys.executable, "-c", CHILD, str(path), str(args.max_context)], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    text = p.stdout + p.stderr[-4000:]
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"load-profile-{args.shape}-{args.quant}.txt").write_text(text)
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
