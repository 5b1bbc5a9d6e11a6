"""Routed-expert decode GEMV tiles swept at a MoE's real shapes, without its GGUF (run on the device).

  python bench/profiling/expert_sweep.py --out DIR [--tiles NAME,...] [--layers 16] [--reps 30]

The 35B-A3B file takes 2-3 minutes to make on a fresh box; these launches need only its expert stacks'
shapes and types (gate/up Q4_K [256 x 512, 2048], down Q6_K [256 x 2048, 512], k = 8). One random stack of
each is made on the host and copied to `--layers` device addresses, each layer routes to its own 8 experts,
and every tile (moe_experts.ExpertTile names: s16d16w4split, s16d16w4split-x8bb2, ...) is first checked
against the naive twins on layer 0 (fp32 paths to 1e-4; int8-x paths to 5e-2, and exactly,
to 1e-4, against the same arithmetic on the dequantized int8 x), then timed as the decode
step sees it: the layers' SwiGLU launches in one CUDA graph, their down launches (+ the split's sum and any
int8 quantization) in another, so no launch finds its experts in L2. Writes one receipt (the tile table,
µs and GB/s per launch, errors) and prints a table; a failing tile is recorded with its error, never 0.

--device cpu: a smoke run at a tiny shape under TRITON_INTERPRET=1 (checks only; times are null, with why).
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

from bench.profiling.gemv_sweep import graph_us_per_launch, rel_err as rel  # noqa: E402
from bench.runtime.decode import Receipt, _err, environment, spread  # noqa: E402

# the 35B-A3B's routed experts (runtime/synth shapes; its file's types: Q4_K gate/up, Q6_K down)
SHAPES = {"35b-a3b": dict(d=2048, ff=512, experts=256, k=8, gate="Q4_K", down="Q6_K"),
          "tiny": dict(d=512, ff=256, experts=8, k=3, gate="Q4_K", down="Q4_K")}
# the engine's default and its neighbours, then the dense paths at the dense sweep's winning shapes for these K
# (gemv-sweep-35b-a3b-h100-20261206T0213Z.json: 4 rows, 2 blocks a step, 1 warp on int8 x) and around them
DEFAULT_TILES = ("s16d16w4split,s16d32w4split,s16d16w4split-bytes,s16d16w4split-words,s16d16w4split-x8,"
                 "s16d16w4split-x8q6,s8d8w4split-x8,s32d16w4split-x8,s16d16w8split-x8bb4,s16d16w2split-x8,"
                 "s16d16w4-x8,s4d8w2split-x8,s8d8w2split-x8q6,s4d4w1split-x8,s4d4w1split-x8q6,s8d8w1split-x8q6,"
                 "s4d8w1split-x8q6,s8d16w2split-x8q6,s4d4w1split-words,s8d8w2split-words")
FP32_TOL, X8_TOL = 1e-4, 5e-2  # int8 x: ~2e-2 on random weights (the exact check below is the strict one)


def stacks(shape: dict, layers: int, device: str) -> list[dict]:
    """Per layer: gate/up/down stacks at their own addresses (copies of one random stack each) and ids."""
    from runtime.gguf import GGMLType
    from runtime.triton.weights import random_qweight

    e, d, ff = shape["experts"], shape["d"], shape["ff"]
    gt, dt_ = GGMLType[shape["gate"]], GGMLType[shape["down"]]
    proto = {"gate": random_qweight(gt, e * ff, d, device, seed=1).data,
             "up": random_qweight(gt, e * ff, d, device, seed=2).data,
             "down": random_qweight(dt_, e * d, ff, device, seed=3).data}
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(layers):
        layer = {k: (v if i == 0 else v.clone()) for k, v in proto.items()}
        layer["ids"] = torch.randperm(e, generator=g)[: shape["k"]].to(torch.int32).to(device)
        w = torch.rand(shape["k"], generator=g) + 0.1
        layer["weights"] = (w / w.sum()).to(device)
        layer["types"] = (gt, dt_)
        out.append(layer)
    return out


class Launches:
    """One tile's SwiGLU and down launches over every layer, with their buffers (static for the graphs)."""

    def __init__(self, tile, layers, shape, device):
        from runtime.kernels.quant_x import Q8Vector

        self.tile, self.layers, self.shape = tile, layers, shape
        d, ff, k = shape["d"], shape["ff"], shape["k"]
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(d, generator=g).to(device)
        self.norm = (1 + 0.1 * torch.randn(d, generator=g)).to(device)
        self.act = [torch.zeros(k, ff, device=device) for _ in layers]
        self.h = torch.randn(d, generator=g).to(device)
        self.shared = torch.randn(d, generator=g).to(device)
        self.slogit = torch.tensor([0.3], device=device)
        self.out = torch.zeros(d, device=device)
        self.part = torch.zeros(k, d, device=device)
        self.q8x, self.q8a = Q8Vector.empty(d, device), Q8Vector.empty(k * ff, device)

    def swiglu(self, i: int):
        from runtime.kernels.moe_experts import experts_swiglu_gemv

        L, (gt, _) = self.layers[i], self.layers[i]["types"]
        experts_swiglu_gemv(self.x, self.norm, 1e-6, L["gate"], gt, L["up"], gt, L["ids"], self.shape["ff"],
                            self.act[i], tile=self.tile, q8=self.q8x)

    def down(self, i: int):
        from runtime.kernels.moe_experts import experts_down_gemv

        L, (_, dt_) = self.layers[i], self.layers[i]["types"]
        experts_down_gemv(self.act[i], L["down"], dt_, L["ids"], L["weights"], self.h, self.out, shared=self.shared,
                          shared_logit=self.slogit, tile=self.tile, part=self.part, q8=self.q8a)


def check(run: Launches) -> dict:
    """Layer 0 against the naive twins."""
    from runtime.kernels.moe_experts import experts_down_gemv_naive, experts_swiglu_gemv_naive

    L, (gt, dt_) = run.layers[0], run.layers[0]["types"]
    run.swiglu(0)
    want = experts_swiglu_gemv_naive(run.x, run.norm, 1e-6, L["gate"], gt, L["up"], gt, L["ids"], run.shape["ff"])
    s_err = rel(run.act[0], want)
    run.down(0)
    want_d = experts_down_gemv_naive(run.act[0], L["down"], dt_, L["ids"], L["weights"], run.h, shared=run.shared,
                                     shared_logit=run.slogit)
    d_err = rel(run.out - run.h, want_d - run.h)
    tol = X8_TOL if run.tile.path in ("x8", "x8q6") else FP32_TOL
    out = {"swiglu_rel": s_err, "down_rel": d_err, "tolerance": tol, "pass": s_err < tol and d_err < tol}
    out.update(exact_int8(run))
    return out


def exact_int8(run: Launches) -> dict:
    """Where a stack took the int8-x path: its launch against the same arithmetic on the dequantized int8 x
    (to FP32_TOL), so the rounding tolerance above cannot hide a wrong block or slot."""
    import torch.nn.functional as F

    from runtime.kernels.moe_experts.gemv_path import path_flags
    from runtime.kernels.moe_experts.naive import _expert
    from runtime.kernels.quant_x import dequantize_q8

    L, (gt, dt_), sh = run.layers[0], run.layers[0]["types"], run.shape
    d, ff, ids = sh["d"], sh["ff"], L["ids"].tolist()
    out = {}
    fg = path_flags(run.tile.path, gt, L["gate"], d, run.tile.block_b)
    if fg["X8"] or fg["X8Q6"]:  # gate and up share type and shape: both on int8 x
        run.swiglu(0)
        xq, r = dequantize_q8(run.q8x, d).double(), float(run.q8x.rstd[0])
        want = torch.stack([F.silu(_expert(L["gate"], gt, e, ff, d).double() @ xq * r)
                            * (_expert(L["up"], gt, e, ff, d).double() @ xq * r) for e in ids])
        out["swiglu_int8_exact_rel"] = rel(run.act[0], want)
    fd = path_flags(run.tile.path, dt_, L["down"], ff, run.tile.block_b)
    if fd["X8"] or fd["X8Q6"]:
        run.down(0)
        aq = dequantize_q8(run.q8a, len(ids) * ff).double().view(len(ids), ff)
        want = sum(float(L["weights"][j]) * (_expert(L["down"], dt_, e, d, ff).double() @ aq[j])
                   for j, e in enumerate(ids))
        shared = torch.sigmoid(run.slogit.double()) * run.shared.double()
        out["down_int8_exact_rel"] = rel(run.out - run.h, want + shared)
    exact = list(out.values())
    if exact:
        out["pass_int8_exact"] = all(v < FP32_TOL for v in exact)
    return out


def route_warps(shape: dict, layers: int, reps: int, device: str, warps=(1, 2, 4)) -> dict:
    """The router's top-k launch (3.7 µs a layer on an H100, decode-profile-35b-a3b-q4_k_m-h100-20261206T021410Z.json)
    at each warp count: its ids and weights against the torch twin's, then µs per launch."""
    from runtime.kernels.moe_route import moe_route, moe_route_naive

    g = torch.Generator().manual_seed(2)
    logits = [torch.randn(1, shape["experts"], generator=g).to(device) for _ in range(layers)]
    ids = torch.empty(1, shape["k"], dtype=torch.int32, device=device)
    w = torch.empty(1, shape["k"], device=device)
    want_ids, want_w = moe_route_naive(logits[0], shape["k"])
    out = {}
    for nw in warps:
        r = out[f"w{nw}"] = {}
        try:
            moe_route(logits[0], shape["k"], ids=ids, weights=w, num_warps=nw)
            r["pass"] = bool(torch.equal(ids.cpu(), want_ids.cpu())) and rel(w, want_w) < FP32_TOL
            if not r["pass"]:
                r["timing"], r["timing_reason"] = None, "ids or weights differ from the twin's"
            elif device.startswith("cuda"):
                r["us"] = spread(graph_us_per_launch(
                    lambda i: moe_route(logits[i], shape["k"], ids=ids, weights=w, num_warps=nw), layers, reps))
            else:
                r["timing"], r["timing_reason"] = None, "CPU interpreter: checks only"
        except Exception as e:
            r["error"] = _err(e)
        print(f"route w{nw}: " + (f"{r['us']['median']:.2f} us" if "us" in r else str(r)), flush=True)
    return out


def bytes_per_layer(shape: dict) -> dict:
    from runtime.gguf import BLOCK, GGMLType

    def row_bytes(t, cols):
        per, nb = BLOCK[GGMLType[t]]
        return cols // per * nb

    k = shape["k"]
    return {"swiglu": 2 * k * shape["ff"] * row_bytes(shape["gate"], shape["d"]),
            "down": k * shape["d"] * row_bytes(shape["down"], shape["ff"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="35b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--tiles", default=DEFAULT_TILES)
    ap.add_argument("--layers", type=int, default=16, help="layers of distinct stacks (more than L2 holds)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=str(ROOT / "bench" / "receipts"))
    args = ap.parse_args(argv)
    from runtime.kernels.moe_experts import ExpertTile

    shape = SHAPES[args.shape]
    tiles = [t for t in args.tiles.split(",") if t]
    parsed = {t: ExpertTile.parse(t) for t in tiles}  # a bad name fails here, before minutes of setup
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    rec = Receipt(Path(args.out) / f"expert-sweep-{args.shape}-{stamp}.json",
                  {"kind": "expert_sweep", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
                   "config": {"shape": args.shape, **shape, "layers": args.layers, "reps": args.reps},
                   "bytes_per_layer": bytes_per_layer(shape), "tiles": {}})
    rec.save()
    layers = stacks(shape, args.layers, args.device)
    cuda = args.device.startswith("cuda")
    nbytes = rec.data["bytes_per_layer"]
    for name, tile in parsed.items():
        r = rec.data["tiles"][name] = {"tile": vars(tile)}
        try:
            run = Launches(tile, layers, shape, args.device)
            r["check"] = check(run)
            if not cuda:
                r["timing"], r["timing_reason"] = None, "CPU interpreter: checks only"
            elif r["check"]["pass"] and r["check"].get("pass_int8_exact", True):
                for part, fn in (("swiglu", run.swiglu), ("down", run.down)):
                    t = spread(graph_us_per_launch(fn, args.layers, args.reps))  # µs per layer
                    r[part] = {"us": t, "gb_per_s": nbytes[part] / (t["median"] * 1e-6) / 1e9}
                r["us_per_layer"] = r["swiglu"]["us"]["median"] + r["down"]["us"]["median"]
        except Exception as e:  # recorded, the next tile runs
            r["error"], r["traceback"] = _err(e), traceback.format_exc()[-2000:]
        rec.save()
        print(f"{name:28s} " + (f"swiglu {r['swiglu']['us']['median']:7.1f} us {r['swiglu']['gb_per_s']:6.0f} GB/s  "
                                f"down {r['down']['us']['median']:6.1f} us {r['down']['gb_per_s']:6.0f} GB/s"
                                if "us_per_layer" in r else r.get("error") or f"check {r.get('check')}"), flush=True)
    rec.data["route"] = route_warps(shape, args.layers, args.reps, args.device)
    rec.save()
    timed = {n: r["us_per_layer"] for n, r in rec.data["tiles"].items() if "us_per_layer" in r}
    rec.data["fastest"] = min(timed, key=timed.get) if timed else None
    rec.save()
    print(f"fastest: {rec.data['fastest']}\nreceipt: {rec.path}")
    ok = all(r.get("check", {}).get("pass") and r["check"].get("pass_int8_exact", True)
             for r in rec.data["tiles"].values())
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
