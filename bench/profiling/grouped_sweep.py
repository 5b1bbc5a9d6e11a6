"""The MoE prefill's grouped-GEMM tiles swept at a MoE's real shapes, without its GGUF (run on the device).

  python bench/profiling/grouped_sweep.py --out DIR [--tiles bm64bn64w4,...] [--tokens 512,4096] [--layers 8]

The 35B-A3B's pp512 is 1.42x llama.cpp (moe-35b-a3b-variants-h100-20261206T051139Z.json) and ~44 ms of each prefill
does not grow with the prompt: every routed expert's weights are dequantized at least once a layer. This times the
routed-expert part of a prefill layer (expert sort, SwiGLU and down grouped GEMMs, the per-token sum) per tile, on
random stacks at the file's shapes and types (expert_sweep.stacks: Q4_K gate/up, Q6_K down) with routes drawn as
the synthetic files route (some experts hot), `--layers` layers at their own addresses so no launch
finds its weights in L2. Each tile is first checked against the torch twin on layer 0 (bf16 operands: 3e-2), then
timed from one CUDA graph per token count; the receipt gives µs per layer and the weights dequantized per ms (each
expert's, once per tile of its tokens: the rate the grouped GEMM is thought to be bound by).
A failing tile is recorded with its error, never 0. --device cpu: a smoke run at a tiny shape (checks only).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
if __name__ == "__main__" and "cpu" in sys.argv:  # --device cpu: the interpreter, set before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from bench.profiling.expert_sweep import SHAPES, stacks  # noqa: E402
from bench.profiling.gemv_sweep import graph_us_per_launch, rel_err as rel  # noqa: E402
from bench.runtime.decode import Receipt, _err, environment, spread  # noqa: E402

# the default at 512 tokens (bm64bn64w4) and tiles that compile for sm_90 without spills (checked with
# runtime.triton.launches.compile_all on meta tensors): more warps, narrower columns, taller rows. bm64bn128w8 left
# with the idle-tile exit (its down kernel took 255 registers and 64 stack bytes; it was the slowest, 2202 us a
# layer at 512 tokens, grouped-sweep-35b-a3b-h100-20261206T075428Z.json)
DEFAULT_TILES = "bm64bn64w4,bm64bn64w8,bm64bn32w4,bm128bn64w8,bm32bn64w4,bm16bn64w4"
TOL = 3e-2  # bf16 operands (the engine's prefill check uses the same bar, tests/runtime/triton/test_moe_engine.py)


def routes(shape: dict, tokens: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] int32 and weights [T, k] routed as the synthetic MoE files route (runtime/synth/init.py): a
    per-expert popularity of std router_hot (some experts hot) plus a token-dependent part of std router_spread."""
    from runtime.synth.init import InitSpec

    spec, g = InitSpec(), torch.Generator().manual_seed(seed)
    e, k = shape["experts"], shape["k"]
    logits = spec.router_spread * torch.randn(tokens, e, generator=g) + spec.router_hot * torch.randn(e, generator=g)
    w, ids = torch.softmax(logits, -1).topk(k, -1)
    return ids.to(torch.int32).to(device), (w / w.sum(-1, keepdim=True)).to(device)


def grouped(layer: dict, x, ids, w, shape: dict, tile):
    from runtime.kernels.moe_experts import grouped_experts

    gt, dt_ = layer["types"]
    return grouped_experts(x, ids, w, layer["gate"], gt, layer["up"], gt, layer["down"], dt_, shape["experts"],
                           shape["ff"], tile=tile)


def check(layer: dict, x, ids, w, shape: dict, tile) -> dict:
    from runtime.kernels.moe_experts import grouped_experts_naive

    gt, dt_ = layer["types"]
    want = grouped_experts_naive(x, ids, w, layer["gate"], gt, layer["up"], gt, layer["down"], dt_, shape["ff"])
    err = rel(grouped(layer, x, ids, w, shape, tile), want)
    return {"rel": err, "tolerance": TOL, "pass": err < TOL}


def weights_per_layer(shape: dict) -> int:
    """Routed-expert weights of a layer (gate, up and down of every expert)."""
    return 3 * shape["experts"] * shape["ff"] * shape["d"]


def dequantized_weights(shape: dict, ids: torch.Tensor, bm: int) -> int:
    """Weights a layer's grouped GEMMs dequantize: each expert's, once per `bm`-row tile of its tokens."""
    counts = torch.bincount(ids.reshape(-1).long().cpu(), minlength=shape["experts"])
    return int((counts + bm - 1).div(bm, rounding_mode="floor").sum()) * weights_per_layer(shape) // shape["experts"]


def g_per_ms(weights: int, us: float) -> float:
    """Billions of weights a millisecond, from a count and microseconds."""
    return weights / (us / 1e3) / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="35b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--tiles", default=DEFAULT_TILES)
    ap.add_argument("--tokens", default="512,4096")
    ap.add_argument("--layers", type=int, default=8, help="layers of distinct stacks (more than L2 holds)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=str(ROOT / "bench" / "receipts"))
    args = ap.parse_args(argv)
    from runtime.kernels.moe_experts import GroupedTile

    shape = SHAPES[args.shape]
    parsed = {t: GroupedTile.parse(t) for t in args.tiles.split(",") if t}  # a bad name fails before setup
    tokens = [int(n) for n in args.tokens.split(",") if n]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    rec = Receipt(Path(args.out) / f"grouped-sweep-{args.shape}-{stamp}.json",
                  {"kind": "grouped_sweep", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
                   "config": {"shape": args.shape, **shape, "tokens": tokens, "layers": args.layers,
                              "reps": args.reps},
                   "weights_per_layer": weights_per_layer(shape), "tiles": {}})
    rec.save()
    layers = stacks(shape, args.layers, args.device)
    cuda = args.device.startswith("cuda")
    g = torch.Generator().manual_seed(3)
    inputs = {n: (torch.randn(n, shape["d"], generator=g).to(torch.bfloat16).to(args.device),
                  *routes(shape, n, args.device, seed=n)) for n in tokens}
    rec.data["experts_with_tokens"] = {n: int(torch.unique(inputs[n][1]).numel()) for n in tokens}
    for name, tile in parsed.items():
        r = rec.data["tiles"][name] = {"tile": vars(tile)}
        try:
            r["check"] = check(layers[0], *inputs[tokens[0]], shape, tile)
            if not cuda:
                r["timing"], r["timing_reason"] = None, "CPU interpreter: checks only"
            elif r["check"]["pass"]:
                for n in tokens:
                    x, ids, w = inputs[n]
                    t = spread(graph_us_per_launch(lambda i: grouped(layers[i], x, ids, w, shape, tile),
                                                   args.layers, args.reps))  # µs per layer
                    deq = dequantized_weights(shape, ids, tile.bm)
                    r[f"t{n}"] = {"us": t, "dequantized_weights": deq,
                                  "g_weights_per_ms": g_per_ms(deq, t["median"])}
        except Exception as e:  # recorded, the next tile runs
            r["error"], r["traceback"] = _err(e), traceback.format_exc()[-2000:]
        rec.save()
        print(f"{name:14s} " + ("  ".join(f"T={n}: {r[f't{n}']['us']['median']:8.1f} us/layer "
                                          f"({r[f't{n}']['g_weights_per_ms']:.2f} G weights/ms)"
                                          for n in tokens if f"t{n}" in r)
                               or r.get("error") or f"check {r.get('check')}"), flush=True)
    for n in tokens:
        timed = {k: v[f"t{n}"]["us"]["median"] for k, v in rec.data["tiles"].items() if f"t{n}" in v}
        rec.data[f"fastest_t{n}"] = min(timed, key=timed.get) if timed else None
    rec.save()
    print(f"receipt: {rec.path}")
    return 0 if all(v.get("check", {}).get("pass") for v in rec.data["tiles"].values()) else 3


if __name__ == "__main__":
    sys.exit(main())
