"""GPU check + throughput of runtime.quant (run by the coordinator on a CUDA machine).

    python3 bench/runtime/quant_gpu.py --out quant_gpu.json

1. Correctness: for every type, CUDA quantize bytes == CPU quantize bytes, and CUDA
   dequantize == CPU dequantize bit for bit (the CPU path is checked against gguf and
   llama-quantize by tests/runtime/quant).
2. Throughput: quantize / dequantize weights per second on CUDA for a 12288x4096 matrix,
   and the projected time to quantize a whole model (Q4_K_M mix) of each real shape.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from math import prod
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runtime.config import SHAPES  # noqa: E402
from runtime.gguf.names import expected_tensors  # noqa: E402
from runtime.gguf.types import GGMLType  # noqa: E402
from runtime.quant import dequantize_bytes, quantize, tensor_types  # noqa: E402

TYPES = [GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.F16, GGMLType.BF16]


def heavy_tailed(rows: int, cols: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    z = torch.randn(rows, cols, generator=g, device=device)
    chi = torch.randn(rows, cols, 3, generator=g, device=device).pow(2).sum(-1)
    return z / torch.sqrt(chi / 3) * 0.02


def timed(fn, repeat: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    report: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "types": {}}

    x_cpu = heavy_tailed(256, 4096, seed=1, device="cpu")  # 1M weights: CPU reference side
    x_cpu[0, :256] = 0
    for gtype in TYPES:
        raw_cpu = quantize(x_cpu, gtype)
        raw_gpu = quantize(x_cpu.cuda(), gtype)
        same_bytes = bool(torch.equal(raw_gpu.cpu(), raw_cpu))
        deq_cpu = dequantize_bytes(raw_cpu, gtype, x_cpu.shape)
        deq_gpu = dequantize_bytes(raw_cpu, gtype, x_cpu.shape, device="cuda")
        same_deq = bool(torch.equal(deq_gpu.cpu().view(torch.int32), deq_cpu.view(torch.int32)))

        big = heavy_tailed(12288, 4096, seed=2, device="cuda")
        t_q = timed(lambda: quantize(big, gtype), repeat=2)
        raw_big = quantize(big, gtype)
        t_d = timed(lambda: dequantize_bytes(raw_big, gtype, big.shape, device="cuda"))
        report["types"][gtype.name] = {
            "cuda_bytes_equal_cpu": same_bytes,
            "cuda_dequant_equal_cpu": same_deq,
            "quantize_weights_per_s": big.numel() / t_q,
            "dequantize_weights_per_s": big.numel() / t_d,
        }
        del big, raw_big
        torch.cuda.empty_cache()
        print(gtype.name, report["types"][gtype.name], flush=True)

    rate = {name: v["quantize_weights_per_s"] for name, v in report["types"].items()}
    report["projected_q4_k_m_quantize_s"] = {}
    for size in ("0.8b", "4b", "9b"):
        cfg = SHAPES[size]
        shapes = expected_tensors(cfg)
        seconds = sum(
            prod(shapes[n]) / rate[t.name] for n, t in tensor_types(cfg, "q4_k_m").items() if t.name in rate
        )
        report["projected_q4_k_m_quantize_s"][size] = seconds
    report["ok"] = all(v["cuda_bytes_equal_cpu"] and v["cuda_dequant_equal_cpu"] for v in report["types"].values())
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
