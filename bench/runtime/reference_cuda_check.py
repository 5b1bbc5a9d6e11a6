"""Run the fp32 reference on CUDA and check it against the HF logits and against the CPU run.

    python3 bench/runtime/reference_cuda_check.py [--fixtures tests/fixtures/qwen35-tiny]

Prints one JSON line: relative errors (batched, token by token) vs HF, CUDA-vs-CPU relative
error, and decode ms/token of the tiny shape (random weights) on CUDA.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runtime.config import SHAPES  # noqa: E402
from runtime.engine import ReferenceEngine  # noqa: E402
from runtime.models.random_weights import random_weights  # noqa: E402


def rel(a, b):
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=str(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "qwen35-tiny"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA not available"}))
        return 1
    fx = Path(args.fixtures)
    ids = np.load(fx / "prompt_ids.npy").astype(np.int64).tolist()
    ref = torch.from_numpy(np.load(fx / "ref_logits_hf_fp32.npy"))
    out = {"device": torch.cuda.get_device_name(), "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
    gpu = ReferenceEngine.from_gguf(fx / "qwen35-tiny4-f32.gguf", device="cuda", max_context=256)
    cpu = ReferenceEngine.from_gguf(fx / "qwen35-tiny4-f32.gguf", device="cpu", max_context=256)
    batched = gpu.prefill(ids, all_logits=True)
    out["rel_err_batched_vs_hf"] = rel(batched, ref)
    out["rel_err_cuda_vs_cpu"] = rel(batched, cpu.prefill(ids, all_logits=True))
    gpu.reset()
    stepped = torch.stack([gpu.decode(t) for t in ids])
    out["rel_err_token_by_token_vs_hf"] = rel(stepped, ref)

    cfg = SHAPES["tiny"]
    eng = ReferenceEngine.from_tensors(cfg, random_weights(cfg), device="cuda", max_context=8192)
    eng.prefill(list(range(1, 1025)))
    eng.generate_greedy(4)
    eng.synchronize()
    t = time.perf_counter()
    eng.generate_greedy(64)
    eng.synchronize()
    out["tiny_decode_ms_per_token_at_1k"] = (time.perf_counter() - t) / 64 * 1e3
    out["memory"] = eng.memory_stats()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
