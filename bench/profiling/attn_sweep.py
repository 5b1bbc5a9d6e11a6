"""Decode-attention sweep (run on the device): split count x launch config at real shapes and depths.

  python bench/profiling/attn_sweep.py --models 0.8b,4b,9b --depths 0,4096,16384 --out DIR

For each model shape, one bf16 K/V cache per attention layer (random, as long as the decode
bench's context), and each config's attention over all layers captured in one CUDA graph: every
layer reads its own cache, so nothing sits in L2, as in the decode step. The position is a
device scalar, so one graph is timed at every depth. Each config is checked against the naive
attention at the deepest depth before it is timed. Stage A sweeps split count x block x warps x
operand precision; stage B sweeps pipelining depth and the combine's head-dim slice for stage A's
fastest. Compiles run first in a process pool (the device has 16 CPUs). Writes one JSON (us per
layer and K/V TB/s per config and depth, the fastest correct config per model) and prints a table.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from runtime.config import shape  # noqa: E402
from runtime.kernels.attn_decode import (AttnConfig, AttnWorkspace, attention_decode,  # noqa: E402
                                         attention_decode_naive, default_n_split)

CTX_PAD = 128 + 64  # bench/runtime/decode.py's max_context = deepest depth + this
DEVICE = "cuda"  # "cpu" under TRITON_INTERPRET=1 for a smoke run of the checks (timing needs CUDA graphs)


def name_of(n_split: int, c: AttnConfig) -> str:
    """s<splits>_t<block_t>_w<warps>[_st<stages>][_lp][_d<combine slice>]"""
    parts = [f"s{n_split}", f"t{c.block_t}", f"w{c.num_warps}"]
    if c.num_stages is not None:
        parts.append(f"st{c.num_stages}")
    if c.lowp:
        parts.append("lp")
    if c.combine_block_d is not None:
        parts.append(f"d{c.combine_block_d}")
    return "_".join(parts)


def stage_a() -> list[tuple[int, AttnConfig]]:
    grid = itertools.product((32, 64, 128, 256), (16, 32, 64), (2, 4, 8), (False, True))
    return [(s, AttnConfig(block_t=t, num_warps=w, lowp=lp)) for s, t, w, lp in grid]


def stage_b(best: list[tuple[int, AttnConfig]]) -> list[tuple[int, AttnConfig]]:
    out = []
    for s, c in best:
        for st, db in itertools.product((1, 2, 3, 4), (None, 64, 128)):
            out.append((s, replace(c, num_stages=st, combine_block_d=db)))
    return out


def _inputs(cfg, ctx: int, dev):
    dh = cfg.head_dim
    kc = (torch.randn(ctx, cfg.n_kv_head, dh, device=dev) * 0.5).to(torch.bfloat16)
    vc = torch.randn(ctx, cfg.n_kv_head, dh, device=dev).to(torch.bfloat16)
    proj = torch.randn(cfg.q_proj_dim + 2 * cfg.kv_proj_dim, device=dev)
    qn, kn = torch.rand(dh, device=dev) + 0.5, torch.rand(dh, device=dev) + 0.5
    return kc, vc, proj, qn, kn


def _kw(cfg) -> dict:
    return dict(n_head=cfg.n_head, n_kv_head=cfg.n_kv_head, head_dim=cfg.head_dim, rope_dims=cfg.rope_dims,
                rope_base=cfg.rope_base, eps=cfg.rms_eps)


def compile_one(model: str, n_split: int, c: AttnConfig) -> str | None:
    """Launch once on a short cache (fills Triton's on-disk cache); the error text if it fails."""
    try:
        cfg = shape(model)
        dev = torch.device(DEVICE)
        kc, vc, proj, qn, kn = _inputs(cfg, 64, dev)
        ws = AttnWorkspace(cfg.n_head, cfg.head_dim, n_split, dev)
        out = torch.empty(cfg.n_head * cfg.head_dim, device=dev)
        attention_decode(proj, qn, kn, torch.tensor([3], dtype=torch.int32, device=dev), kc, vc, out, ws,
                         config=c, **_kw(cfg))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:300]


def precompile(model: str, configs, workers: int) -> dict:
    if workers <= 1:
        return {name_of(s, c): compile_one(model, s, c) for s, c in configs}
    import multiprocessing as mp

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        futs = {name_of(s, c): pool.submit(compile_one, model, s, c) for s, c in configs}
        return {n: f.result() for n, f in futs.items()}


class Bench:
    """One model's caches (one per attention layer) and the graph timing of a config over all of them."""

    def __init__(self, model: str, depths: list[int]):
        self.cfg = cfg = shape(model)
        self.depths = depths
        self.ctx = max(depths) + CTX_PAD
        self.dev = torch.device(DEVICE)
        self.n_layers = len(cfg.attention_layers)
        self.layers = [_inputs(cfg, self.ctx, self.dev) for _ in range(self.n_layers)]
        self.outs = [torch.empty(cfg.n_head * cfg.head_dim, device=self.dev) for _ in range(self.n_layers)]
        self.pos = torch.zeros(1, dtype=torch.int32, device=self.dev)

    def kv_bytes(self, depth: int) -> int:
        return (depth + 1) * self.cfg.n_kv_head * self.cfg.head_dim * 2 * 2  # K and V, bf16

    def check(self, n_split: int, c: AttnConfig) -> float:
        """Relative error vs the naive attention at the deepest depth (layer 0, copies of its cache)."""
        kc, vc, proj, qn, kn = self.layers[0]
        depth = max(self.depths)
        pos = torch.tensor([depth], dtype=torch.int32, device=self.dev)
        ws = AttnWorkspace(self.cfg.n_head, self.cfg.head_dim, n_split, self.dev)
        ws.acc.fill_(float("nan"))
        out = torch.full_like(self.outs[0], float("nan"))
        k1, v1, k2, v2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
        attention_decode(proj, qn, kn, pos, k1, v1, out, ws, config=c, **_kw(self.cfg))
        ref = attention_decode_naive(proj, qn, kn, pos, k2, v2, torch.empty_like(out), **_kw(self.cfg))
        return float((out.double() - ref.double()).norm() / ref.double().norm())

    def time(self, n_split: int, c: AttnConfig, reps: int) -> dict:
        ws = AttnWorkspace(self.cfg.n_head, self.cfg.head_dim, n_split, self.dev)
        kw = _kw(self.cfg)

        def all_layers():
            for (kc, vc, proj, qn, kn), out in zip(self.layers, self.outs):
                attention_decode(proj, qn, kn, self.pos, kc, vc, out, ws, config=c, **kw)

        self.pos.fill_(max(self.depths))
        all_layers()  # compile (if the pool did not) and warm up outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            all_layers()
        res = {}
        for depth in self.depths:
            self.pos.fill_(depth)
            for _ in range(3):
                g.replay()
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            for a, b in ev:
                a.record()
                g.replay()
                b.record()
            torch.cuda.synchronize()
            ts = sorted(a.elapsed_time(b) * 1e3 / self.n_layers for a, b in ev)  # us per layer
            med = ts[len(ts) // 2]
            res[str(depth)] = {"us_per_layer": round(med, 3), "spread_pct": round(100 * (ts[-1] - ts[0]) / med, 2),
                               "kv_TBps": round(self.kv_bytes(depth) / (med * 1e-6) / 1e12, 3)}
        del g
        return res


def run_configs(bench: Bench, configs, reps: int, log) -> dict:
    rows = {}
    for s, c in configs:
        name = name_of(s, c)
        row = {"n_split": s, "config": asdict(c)}
        try:
            row["rel_err"] = err = bench.check(s, c)
            row["ok"] = err < 2e-2
            if row["ok"]:
                row["depths"] = bench.time(s, c, reps)
        except Exception as e:
            row["ok"], row["error"] = False, f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
        rows[name] = row
        d = row.get("depths", {})
        log(f"  {name:28s} err {row.get('rel_err', float('nan')):.1e} " +
            " ".join(f"@{k}: {v['us_per_layer']:7.2f} us {v['kv_TBps']:5.2f} TB/s" for k, v in d.items()))
    return rows


def fastest(rows: dict, depth: int, k: int = 1) -> list[str]:
    ok = [n for n, r in rows.items() if r.get("ok") and "depths" in r]
    return sorted(ok, key=lambda n: rows[n]["depths"][str(depth)]["us_per_layer"])[:k]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="0.8b,4b,9b")
    ap.add_argument("--depths", default="0,4096,16384")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--top", type=int, default=4, help="stage A winners (first model, deepest depth) for stage B")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / ".cache" / "bench-out"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/profiling/attn_sweep.py needs a CUDA device", file=sys.stderr)
        return 2
    from bench.runtime.decode import environment

    depths = [int(d) for d in args.depths.split(",")]
    models = [m for m in args.models.split(",") if m]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"attn-sweep-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    rec = {"kind": "attn_decode_sweep", "argv": sys.argv[1:], "env": environment(), "depths": depths,
           "gpu_sms": torch.cuda.get_device_properties(0).multi_processor_count, "models": {}}

    def save():
        path.write_text(json.dumps(rec, indent=1))

    def log(msg):
        print(msg, flush=True)

    deep = max(depths)
    configs = stage_a()
    t = time.perf_counter()
    rec["compile_a"] = {n: e for n, e in precompile(models[0], configs, args.workers).items() if e}
    log(f"stage A compiles: {time.perf_counter() - t:.0f} s, {len(rec['compile_a'])} failed")
    stage_b_configs = None
    for model in models:
        bench = Bench(model, depths)
        ctx = bench.ctx
        r = rec["models"][model] = {"ctx": ctx, "attention_layers": bench.n_layers,
                                    "default": {"n_split": default_n_split(ctx, rec["gpu_sms"]),
                                                "config": asdict(AttnConfig())}}
        log(f"{model}: ctx {ctx}, {bench.n_layers} attention layers")
        base = [(r["default"]["n_split"], AttnConfig(num_warps=4))]
        r["stage_a"] = run_configs(bench, base + [sc for sc in configs if sc != base[0]], args.reps, log)
        save()
        if stage_b_configs is None:
            winners = fastest(r["stage_a"], deep, args.top)
            picked = [(r["stage_a"][n]["n_split"], AttnConfig(**r["stage_a"][n]["config"])) for n in winners]
            stage_b_configs = stage_b(picked)
            t = time.perf_counter()
            rec["compile_b"] = {n: e for n, e in precompile(model, stage_b_configs, args.workers).items() if e}
            log(f"stage B compiles: {time.perf_counter() - t:.0f} s")
        r["stage_b"] = run_configs(bench, stage_b_configs, args.reps, log)
        rows = {**r["stage_a"], **r["stage_b"]}
        r["fastest_at_deepest"] = fastest(rows, deep, 5)
        r["fastest_at_0"] = fastest(rows, min(depths), 5)
        save()
        del bench
        torch.cuda.empty_cache()
    log(f"\nreceipt: {path}")
    for model, r in rec["models"].items():
        rows = {**r["stage_a"], **r["stage_b"]}
        log(f"{model} (default s{r['default']['n_split']}):")
        for n in dict.fromkeys([name_of(r["default"]["n_split"], AttnConfig(num_warps=4))] + r["fastest_at_deepest"]
                               + r["fastest_at_0"][:2]):
            d = rows[n]["depths"]
            log(f"  {n:28s} " + " ".join(f"@{k} {v['us_per_layer']:7.2f} us ({v['kv_TBps']:.2f} TB/s)" for k, v in d.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
