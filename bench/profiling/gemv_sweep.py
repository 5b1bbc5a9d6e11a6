"""GEMV tile sweep on one model's real decode launches (run on the device).

  python bench/profiling/gemv_sweep.py --gguf PATH --out DIR [--configs NAME,...]

Records the GEMV calls of one decode step (the engine's own launch sequence: same buffers,
epilogues and matrices), groups them by launch shape (gemv.tile_key), and times each config
on ALL layers' matrices of a group in one CUDA graph. Every layer has its own weights, so a
launch never finds its matrix in L2: this is the DRAM-bound time the decode step sees (a
one-matrix do_bench would time the L2 for matrices under 60 MB). Each config is first checked
against the byte-wise default on copies of the first call's inputs. Writes one JSON (groups,
per-config us / GB/s / error, and the fastest correct config per group as a tile table that
`bench/runtime/decode.py --tile-table` times end to end) and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from runtime.kernels.gemv import AutoTile, GemvConfig, tile_key  # noqa: E402
from runtime.kernels.gemv.kernel import resolve_config, words_fit, x8_applies  # noqa: E402

DEFAULT_CONFIGS = ("bytes_v2,words_v3,bytes_8x2w4,bytes_4x4w4,bytes_16x2w8,bytes_2x8w4,words_32x2w4,words_16x2w2,"
                   "words_32x2w2,words_16x2w1,words_32x4w4,words_64x4w8,words_8x2w1")


def config(name: str):
    """bytes_v2 / words_v3 = the AutoTile heuristics; {bytes|words|x8|x8q6}_<BN>x<BB>w<warps> = an explicit
    tile (x8: Q4_K against int8 x with dp4a, other types word-wise; x8q6: Q6_K too)."""
    autos = {"bytes_v2": AutoTile(2, words=False), "words_v3": AutoTile(3, words=True)}
    if name in autos:
        return autos[name]
    base, q6once, _ = name.partition("_q6once")  # suffix: Q6_K's qh read once (GemvConfig.q6 = 2)
    path, _, tile = base.partition("_")
    try:
        bn, rest = tile.split("x")
        bb, nw = rest.split("w")
        if path not in ("bytes", "words", "x8", "x8q6"):
            raise ValueError(path)
        return GemvConfig(int(bn), int(bb), int(nw), q6=2 if q6once else 1, words=path != "bytes",
                          x8=path in ("x8", "x8q6"), x8_q6=path == "x8q6")
    except ValueError:
        raise ValueError(f"bad config name {name!r}: bytes_v2, words_v3 or "
                         f"{{bytes|words|x8|x8q6}}_<BN>x<BB>w<warps>[_q6once]") from None


FP32_TOL = 1e-4  # fp32 x: the dot products differ from the byte-wise path by summation order only
X8_TOL = 2e-2  # int8 x: ~4e-3 per dot product from rounding x (the decode's KL / top-1 check decides)


def tolerance(cfg) -> float:
    return X8_TOL if getattr(cfg, "x8", False) else FP32_TOL


def record_calls(eng) -> tuple[list[tuple], list[tuple]]:
    """(x, ws, out, kwargs) of every gemv call in one eager decode step of `eng` (live buffers, for
    timing), and each call on clones of its inputs as the decode step had them (for the checks:
    timing replays mutate the live ones, e.g. the residual stream every later call reads)."""
    from runtime.triton import decode as decode_mod
    from runtime.triton import moe as moe_mod  # the MoE's router and shared expert

    calls, snapshots = [], []
    real = decode_mod.gemv

    def recorder(x, ws, out=None, **kw):
        kw.pop("config", None)
        calls.append((x, list(ws), out, kw))
        _, ws_c, out_c, kw_c = _copy_call(calls[-1])
        snapshots.append((x.clone(), ws_c, out_c, kw_c))
        return real(x, ws, out, **kw)

    decode_mod.gemv = moe_mod.gemv = recorder
    try:
        eng.step()
        eng.synchronize()
    finally:
        decode_mod.gemv = moe_mod.gemv = real
    return calls, snapshots


def _run(call, config):
    from runtime.kernels.gemv import gemv

    x, ws, out, kw = call
    return gemv(x, ws, out, config=config, **kw)


def _copy_call(call):
    """The call on clones of its mutable tensors (out, residual alias, conv state)."""
    x, ws, out, kw = call
    kw = dict(kw)
    out_c = out.clone()
    if kw.get("residual") is not None:
        kw["residual"] = out_c if kw["residual"] is out else kw["residual"].clone()
    if kw.get("conv_state") is not None:
        kw["conv_state"] = kw["conv_state"].clone()
    return (x, ws, out_c, kw)


def rel_err(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def time_group(calls, config, reps: int) -> float:
    """Median us per launch of the group's calls replayed in one CUDA graph."""
    times = sorted(graph_us_per_launch(lambda i: _run(calls[i], config), len(calls), reps))
    return times[len(times) // 2]


def graph_us_per_launch(launch, n: int, reps: int) -> list[float]:
    """launch(0..n-1) captured in one CUDA graph after a compiling warm-up; µs per launch of `reps` replays."""
    for i in range(n):  # compile + warm
        launch(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for i in range(n):
                launch(i)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / n)
    return times


def applies(config, ws, swiglu) -> bool:
    """Whether a config runs as named on these matrices (an explicit words tile that cannot be
    read word-wise would silently time the byte path)."""
    if isinstance(config, GemvConfig) and config.x8:
        return x8_applies(config, ws)
    if isinstance(config, GemvConfig) and config.words:
        return all(words_fit(w, config.block_b) for w in ws)
    return True


def sweep(eng, names: list[str], reps: int, on_group=lambda groups: None, only: list[str] | None = None) -> dict:
    """Every group's configs; on_group(results so far) after each group (the receipt is rewritten
    then, so a step timeout keeps what was measured)."""
    calls, snapshots = record_calls(eng)
    groups: dict[str, list] = {}
    firsts: dict[str, tuple] = {}
    for c, snap in zip(calls, snapshots):
        key = tile_key(c[1], c[3].get("swiglu", False))
        groups.setdefault(key, []).append(c)
        firsts.setdefault(key, snap)
    cfgs = {n: config(n) for n in names}
    out = {}
    for key, gcalls in groups.items():
        if only and not any(o in key for o in only):
            continue
        ws0, kw0 = gcalls[0][1], gcalls[0][3]
        swiglu = kw0.get("swiglu", False)
        nbytes = sum(w.nbytes for w in ws0)
        first = firsts[key]  # the group's first call on the inputs the decode step gave it
        ref = _run(_copy_call(first), AutoTile(2)).clone()
        rows = []
        for name in names:
            cfg = cfgs[name]
            if not applies(cfg, ws0, swiglu):
                continue
            r = {"name": name, "config": asdict(resolve_config(cfg, ws0, "cuda", swiglu)), "tolerance": tolerance(cfg)}
            try:
                r["rel_err"] = rel_err(_run(_copy_call(first), cfg), ref)
                r["us"] = time_group(gcalls, cfg, reps)
                r["GBps"] = nbytes / (r["us"] * 1e-6) / 1e9
            except Exception as e:  # report and go on: one failing tile must not end the sweep
                r["error"] = f"{type(e).__name__}: {e}"[:400]
                traceback.print_exc()
            rows.append(r)
        ok = [r for r in rows if r.get("us") and r.get("rel_err", 1) < r["tolerance"]]
        best = min(ok, key=lambda r: r["us"]) if ok else None
        out[key] = {"calls": len(gcalls), "bytes_per_launch": nbytes, "types": [w.qtype.name for w in ws0],
                    "epilogue": sorted(k for k, v in kw0.items() if v is not None and v is not False),
                    "results": rows, "best": best["name"] if best else None}
        on_group(out)
        print(f"{key:60} x{len(gcalls):<3} " + " ".join(
            f"{r['name']}={r['GBps']:.0f}" if r.get("GBps") else f"{r['name']}=ERR" for r in rows), flush=True)
    return out


def tile_table(groups: dict) -> dict:
    """{tile_key: GemvConfig fields} of each group's fastest correct config (as it resolved)."""
    return {key: next(r["config"] for r in g["results"] if r["name"] == g["best"])
            for key, g in groups.items() if g["best"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, type=Path)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / ".cache" / "bench-out"))
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma list of config names (see config())")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--copy-to", type=Path, default=None)
    ap.add_argument("--groups", default="", help="comma list of substrings: sweep only launch shapes whose key has one")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/profiling/gemv_sweep.py needs a CUDA device", file=sys.stderr)
        return 2
    from runtime.gguf import load_gguf
    from runtime.triton.engine import TritonEngine

    names = [n for n in args.configs.split(",") if n]
    try:
        [config(n) for n in names]
    except ValueError as e:
        ap.error(str(e))
    t0 = time.perf_counter()
    model = load_gguf(args.gguf)
    eng = TritonEngine(model, "cuda", 512, use_graph=False)
    eng.decode(7)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gemv-sweep-{model.config.name}.json"
    res = {"kind": "gemv_sweep", "gguf": str(args.gguf), "model": model.config.name,
           "gpu": torch.cuda.get_device_name(), "commit": os.environ.get("TOKENGATE_COMMIT")}

    def save(groups: dict) -> None:
        res.update(groups=groups, table=tile_table(groups), seconds=round(time.perf_counter() - t0, 1))
        for p in [path] + ([args.copy_to / path.name] if args.copy_to else []):
            p.parent.mkdir(parents=True, exist_ok=True)  # a copy outside $OUT: the next call on a warm machine
            p.write_text(json.dumps(res, indent=1))

    groups = sweep(eng, names, args.reps, on_group=save, only=[g for g in args.groups.split(",") if g])
    save(groups)
    print(f"\nsweep: {path} ({res['seconds']} s)")
    for key, g in groups.items():
        by = {r["name"]: r for r in g["results"]}
        base = by.get("bytes_v2", {}).get("us")
        best = by.get(g["best"] or "", {})
        print(f"{key[:58]:58} x{g['calls']:<3} bytes_v2 {base or float('nan'):7.1f} us  best {g['best']} "
              f"{best.get('us', float('nan')):7.1f} us {best.get('GBps', float('nan')):6.0f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
