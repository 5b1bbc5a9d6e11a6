"""Turn llama-bench's JSON output into a receipt (run on the device, after llama-bench).

  python3 bench/llamacpp/llamacpp_receipt.py --llama-commit 3f545be --flags "-ngl 99 -fa 1" --out DIR \\
      0.8b=PATH.gguf:llama-0.8b.json 9b=PATH.gguf:llama-9b.json

llama.cpp itself is built from source on the device in an ignored folder and never committed;
this script only reads what `llama-bench -o json` printed, hashes the GGUF it ran on and writes
one receipt (GPU, driver, commits, sha256, per test: samples, n, median, spread) that
`bench/runtime/decode.py --llama-cpp RECEIPT` uses for same-run ratios.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.runtime.decode import environment, sha256  # noqa: E402


def results(shape: str, gguf: Path, bench_json: Path, digest: str) -> list[dict]:
    """One record per llama-bench test (a pp or tg at one depth)."""
    rows = []
    for t in json.loads(bench_json.read_text()):
        ts = [float(x) for x in t.get("samples_ts") or []]
        if not ts:
            rows.append({"shape": shape, "n_prompt": t.get("n_prompt"), "n_gen": t.get("n_gen"),
                         "n_depth": t.get("n_depth", 0), "median": None, "reason": "llama-bench gave no samples"})
            continue
        med = statistics.median(ts)
        rows.append({"shape": shape, "file": gguf.name, "path": str(gguf), "gguf_sha256": digest,
                     "n_prompt": t["n_prompt"], "n_gen": t["n_gen"], "n_depth": t.get("n_depth", 0), "samples_tok_s": ts, "n": len(ts),
                     "median": med, "spread_pct": 100 * (max(ts) - min(ts)) / med,
                     "llama_build_commit": t.get("build_commit"), "gpu_info": t.get("gpu_info"),
                     "type_k": t.get("type_k"), "flash_attn": t.get("flash_attn"), "n_ubatch": t.get("n_ubatch")})
    return rows


def tg128_by_depth(receipt: dict) -> dict[str, dict[int, dict]]:
    """{shape: {depth: record}} of the tg128 tests in a receipt this script wrote."""
    out: dict[str, dict[int, dict]] = {}
    for r in receipt.get("results", []):
        if r.get("n_gen") == 128 and not r.get("n_prompt") and r.get("median"):
            out.setdefault(r["shape"], {})[int(r["n_depth"])] = r
    return out


def pp_by_tokens(receipt: dict) -> dict[str, dict[int, dict]]:
    """{shape: {prompt tokens: record}} of the prompt-processing tests (no generation, depth 0)."""
    out: dict[str, dict[int, dict]] = {}
    for r in receipt.get("results", []):
        if r.get("n_prompt") and not r.get("n_gen") and not r.get("n_depth") and r.get("median"):
            out.setdefault(r["shape"], {})[int(r["n_prompt"])] = r
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="SHAPE=GGUF:LLAMA_BENCH_JSON")
    ap.add_argument("--llama-commit", required=True)
    ap.add_argument("--flags", required=True, help="the llama-bench flags used, for the record")
    ap.add_argument("--build", default="CUDA sm_90, Release, GGML_CUDA=ON, built from source on the device "
                                        "in an ignored folder")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    rec = {"kind": "llamacpp_bench", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "llama_cpp_commit": args.llama_commit, "build": args.build, "flags": args.flags,
           "env": environment(), "results": [], "missing": []}
    for run in args.runs:
        shape, _, rest = run.partition("=")
        gguf, _, js = rest.rpartition(":")
        gguf, js = Path(gguf), Path(js)
        if not js.is_file() or not js.read_text().strip():
            rec["missing"].append({"shape": shape, "reason": f"no llama-bench output at {js}"})
            continue
        try:
            rec["results"] += results(shape, gguf, js, sha256(gguf))
        except (ValueError, KeyError) as e:
            rec["missing"].append({"shape": shape, "reason": f"unreadable llama-bench output: {e}"})
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"llamacpp-bench-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(rec, indent=1))
    for r in rec["results"]:
        print(f"{r['shape']:5s} pp{r['n_prompt']} tg{r['n_gen']} @{r['n_depth']}: {r['median']} tok/s "
              f"(n={r.get('n')}, spread {r.get('spread_pct', 0):.1f} %)")
    for m in rec["missing"]:
        print(f"{m['shape']}: MISSING: {m['reason']}")
    print(f"receipt: {path}")
    return 0 if rec["results"] else 1


if __name__ == "__main__":
    sys.exit(main())
