"""GPU-box check of the synthetic model factory (run by the coordinator on the device).

    python bench/runtime/synth_check.py [--out DIR] [--shapes 0.8b,4b,9b] [--no-report]

Synthesises 0.8b/4b/9b q4_k_m (+ 0.8b f32 and q8_0) with CUDA quantization and prints, per
file: size next to llama.cpp's (anchor JSON), sha256, synth time, whether every tensor got
llama.cpp's type; then the 0.8B `synth --report` statistics (reference forward on CUDA:
Q8_0 vs F32 and Q4_K_M vs F32).  Writes everything to DIR/synth_check.json ($OUT if set).
Needs the `gguf` package (wheel carried by the coordinator).
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

from runtime.gguf import load_gguf  # noqa: E402
from runtime.synth.factory import synthesize  # noqa: E402
from runtime.synth.plan import type_counts  # noqa: E402

ANCHOR_PATHS = [Path(__file__).resolve().parents[1] / "anchors" / "llamacpp-h200-anchor.json"]


def anchor():
    for p in ANCHOR_PATHS:
        if p.is_file():
            return json.loads(p.read_text())["q4_k_m_tensor_types"]
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "synth_out"))
    ap.add_argument("--shapes", default="0.8b,4b,9b")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the big files (default: delete after checking)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("SYNTH_WORK", "/tmp/synth_check"))
    work.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ref = anchor()
    results = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__, "files": []}
    jobs = [(s, "q4_k_m") for s in args.shapes.split(",")] + [("0.8b", "f32"), ("0.8b", "q8_0")]
    for shape, quant in jobs:
        path = work / f"synth-{shape}-{quant}.gguf"
        t0 = time.time()
        r = synthesize(shape, quant, 0, path, device=device)
        dt = time.time() - t0
        row = {"shape": shape, "quant": quant, "bytes": r.nbytes, "sha256": r.sha256, "synth_s": round(dt, 1)}
        m = load_gguf(path)
        counts = type_counts(list(m.tensors.values()))
        row["type_counts"] = counts
        if quant == "q4_k_m" and ref and shape in ref:
            a = ref[shape]
            row["llama_cpp_bytes"] = a["file_bytes"]
            row["size_rel_diff"] = (r.nbytes - a["file_bytes"]) / a["file_bytes"]
            row["types_match_llama_cpp"] = counts == a["types_by_tensor"]
        results["files"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "type_counts"}), flush=True)
        if not (args.keep or (shape == "0.8b" and quant == "f32")):
            path.unlink()
    if not args.no_report:
        from runtime.synth.report import report

        t0 = time.time()
        rep = report(work / "synth-0.8b-f32.gguf", device=device, n_prompts=4, length=128)
        rep["report_s"] = round(time.time() - t0, 1)
        results["report_0.8b"] = rep
        print(json.dumps(rep, indent=1), flush=True)
    (out / "synth_check.json").write_text(json.dumps(results, indent=1))
    if not args.keep:
        (work / "synth-0.8b-f32.gguf").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
