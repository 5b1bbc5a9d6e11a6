"""First qwen35moe receipt on one GPU: synthesize the 35B-A3B Q4_K_M file on the device, check the MoE
kernels against their naive twins at the real shapes, check one layer's decode FFN against the fp32
reference MoE FFN, then time decode tg128 @0 and prefill pp512 / pp4096 (median of --runs, spread).

  TOKENGATE_COMMIT=<sha> python bench/runtime/moe.py --out "$OUT" [--shape 35b-a3b] [--runs 3]

ONE receipt JSON (bench/runtime/decode.py's Receipt / environment helpers) rewritten after every piece, so a
crash or a timeout keeps what ran; every piece in its own try/except (errors recorded, never 0).
No llama.cpp here: its ratio needs a same-call llama.cpp build (issue 17 item 3).
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.runtime.decode import Receipt, _err, _now, environment, spread, time_tg  # noqa: E402


DEV = ["cuda"]


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def kernel_checks(eng) -> dict:
    from runtime.kernels.moe_experts import (ExpertTile, experts_down_gemv, experts_down_gemv_naive,
                                             experts_swiglu_gemv, experts_swiglu_gemv_naive, grouped_experts,
                                             grouped_experts_naive)
    from runtime.kernels.moe_route import moe_route, moe_route_naive

    cfg, mat = eng.config, eng.weights.mat
    p = "blk.0."
    g, u, d = mat[p + "ffn_gate_exps.weight"], mat[p + "ffn_up_exps.weight"], mat[p + "ffn_down_exps.weight"]
    gen = torch.Generator(device=DEV[0]).manual_seed(0)
    out = {"types": {"gate": g.qtype.name, "up": u.qtype.name, "down": d.qtype.name}}
    logits = torch.randn(64, cfg.n_expert, device=DEV[0], generator=gen) * 2
    ids, w = moe_route(logits, cfg.n_expert_used)
    ids_n, w_n = moe_route_naive(logits, cfg.n_expert_used)
    out["route_ids_equal"] = bool(torch.equal(ids, ids_n))
    out["route_weights_rel"] = rel(w, w_n)
    x = torch.randn(cfg.d_model, device=DEV[0], generator=gen)
    norm = torch.ones(cfg.d_model, device=DEV[0])
    res = torch.randn(cfg.d_model, device=DEV[0], generator=gen)
    want_act = experts_swiglu_gemv_naive(x, norm, cfg.rms_eps, g.data, g.qtype, u.data, u.qtype, ids[0], cfg.d_ffn_exp)
    # the fp32 tile path (to ~1e-6) and the engine's own tile (int8 x: ~1e-2 on random x; expert_sweep.py checks
    # those paths exactly against the dequantized int8 x), each without the shared expert
    for key, tile in (("", ExpertTile(16, 16, split_down=True)),
                      ("_engine_tile", replace(eng.step.expert_tile, fold_shared=False))):
        act = torch.empty(cfg.n_expert_used, cfg.d_ffn_exp, device=DEV[0])
        experts_swiglu_gemv(x, norm, cfg.rms_eps, g.data, g.qtype, u.data, u.qtype, ids[0], cfg.d_ffn_exp, act,
                            tile=tile)
        out[f"decode_swiglu_rel{key}"] = rel(act, want_act)
        y = torch.empty_like(res)
        part = torch.empty(cfg.n_expert_used, cfg.d_model, device=DEV[0])  # the split down launch's fp32 scratch
        experts_down_gemv(want_act, d.data, d.qtype, ids[0], w[0], res, y, part=part, tile=tile)
        out[f"decode_down_rel{key}"] = rel(y - res, experts_down_gemv_naive(want_act, d.data, d.qtype, ids[0], w[0],
                                                                             res) - res)
    out["engine_tile"] = vars(eng.step.expert_tile)
    xs = torch.randn(64, cfg.d_model, device=DEV[0], generator=gen).to(torch.bfloat16)
    got = grouped_experts(xs, ids, w, g.data, g.qtype, u.data, u.qtype, d.data, d.qtype, cfg.n_expert, cfg.d_ffn_exp)
    out["prefill_grouped_rel"] = rel(got, grouped_experts_naive(xs, ids, w, g.data, g.qtype, u.data, u.qtype, d.data,
                                                                d.qtype, cfg.d_ffn_exp))
    return out


def layer_check(eng, model) -> dict:
    """Layer 0's decode FFN on the device vs the fp32 reference MoE FFN on the dequantized layer."""
    from runtime.models.attention_ref import rms_norm_ref
    from runtime.models.moe_ref import moe_ffn_ref
    from runtime.triton.moe import decode_ffn

    cfg, p = eng.config, "blk.0."
    w = {n: qt.dequantize(device=DEV[0]) for n, qt in model.tensors.items() if n.startswith(p)}
    h = torch.randn(1, cfg.d_model, device=DEV[0], generator=torch.Generator(device=DEV[0]).manual_seed(1))
    h[:, 0] = 4.0
    eng.bufs.h.copy_(h)
    decode_ffn(eng.step, p)
    want, ids = moe_ffn_ref(rms_norm_ref(h, w[p + "post_attention_norm.weight"], cfg.rms_eps), w, p, cfg.n_expert_used)
    same = sorted(eng.bufs.moe.ids[0].tolist()) == sorted(ids[0].tolist())
    r = {"same_experts": same, "rel": rel(eng.bufs.h - h, want)}
    eng.bufs.h.zero_()
    return r


def uniform_table(eng, name: str):
    """gemv_sweep's tile `name` for every dense GEMV launch of one decode step where it runs as named (router and
    shared expert included), the default table's tile elsewhere: the MoE's shapes were never swept."""
    from bench.profiling.gemv_sweep import applies, config, record_calls
    from runtime.kernels.gemv import TileTable, tile_key

    tile, (entries, fallback) = config(name), default_tiles(eng)
    calls, _ = record_calls(eng)
    eng.reset()
    launches = {tile_key(ws, bool(kw.get("swiglu"))): (ws, bool(kw.get("swiglu"))) for _, ws, _, kw in calls}
    tiled = sorted(k for k, (ws, swiglu) in launches.items() if applies(tile, ws, swiglu))
    entries.update({k: tile for k in tiled})
    return TileTable(tuple(sorted(entries.items())), fallback), tiled


def default_tiles(eng) -> tuple[dict, object]:
    """The engine's default GEMV table on its device: (entries by launch shape, fallback)."""
    from runtime.kernels.gemv import AutoTile, TileTable
    from runtime.kernels.gemv.tiles import default_config

    base = default_config(eng.device)
    return (dict(base.entries), base.fallback) if isinstance(base, TileTable) else ({}, AutoTile())


def swept_table(eng, path: Path):
    """The tiles a gemv_sweep of this model measured (its JSON at `path`) over the default table: each swept launch
    shape takes its own fastest correct tile, the rest stay as they are."""
    import json

    from runtime.kernels.gemv import TileTable

    (entries, fallback), swept = default_tiles(eng), TileTable.from_dict(json.loads(path.read_text())["table"])
    return TileTable(tuple(sorted((entries | dict(swept.entries)).items())), fallback), sorted(dict(swept.entries))


def expert_tile(name: str):
    """A variant's EXPERT part: "default" (or nothing) is the engine's own default tile, not ExpertTile()'s
    field defaults (those are the fused 32-row launch: 166 against 250 tok/s in moe-35b-a3b-20261206T021515Z)."""
    from runtime.kernels.moe_experts import DEFAULT_EXPERT_TILE, ExpertTile

    return DEFAULT_EXPERT_TILE if name in ("", "default") else ExpertTile.parse(name)


def time_variant(eng, model, name: str, max_ctx: int, args) -> dict:
    """One decode variant, "DENSE+EXPERT" (either part "default"): its own engine, layer and reference checks,
    tg128 @0. DENSE names a gemv_sweep tile for every dense launch, or a gemv_sweep JSON of this model (each launch
    shape its swept tile); EXPERT an ExpertTile (e.g. s16d16w4split)."""
    from bench.runtime.decode import reference_check
    from runtime.triton.engine import TritonEngine

    dense, _, expert = name.partition("+")
    if dense in ("", "default"):
        table, tiled = None, []
    elif dense.endswith(".json"):
        table, tiled = swept_table(eng, Path(dense))
    else:
        table, tiled = uniform_table(eng, dense)
    tile = expert_tile(expert)
    var = TritonEngine(model, device=args.device, max_context=max_ctx, gemv_config=table, expert_tile=tile)
    try:
        out = {"expert_tile": vars(tile), "dense_tile": dense or "default", "dense_shapes_tiled": tiled,
               "layer_check": layer_check(var, model)}
        out["reference_check"] = reference_check(var, seeds=(0,), positions=args.ref_positions)
        out["tg128@0"] = time_tg(var, 0, args.runs, n_tokens=args.tg)
        return out
    finally:
        del var
        if args.device == "cuda":
            torch.cuda.empty_cache()


def prefill_variant(eng, name: str, lengths: list[int], runs: int) -> dict:
    """One MoE prefill variant: "+"-joined parts, each "graph" (the whole prefill replayed from a CUDA graph) or a
    grouped-GEMM tile (GroupedTile name, e.g. bm16bn64w4). The first length's last logits against the engine's eager
    prefill with the default tile on the same prompt, then pp at every length; the engine's own settings after (the
    MoE prefill graph is on by default), even on error."""
    from runtime.kernels.moe_experts import GroupedTile

    parts = name.split("+")
    tiles = [GroupedTile.parse(p) for p in parts if p != "graph"]
    if len(tiles) > 1:
        raise ValueError(f"prefill variant {name!r}: at most one grouped tile")
    ids = prompt(eng, lengths[0])
    other = prompt(eng, lengths[0], seed=lengths[0] + 1)  # routed otherwise: a replay must not keep the capture's
    own = {k: getattr(eng, k) for k in ("grouped_tile", "moe_prefill_graphs") if hasattr(eng, k)}
    try:
        eng.grouped_tile, eng.moe_prefill_graphs = None, False  # the reference: the default tile, eager
        want = {}
        for name, p in (("", ids), ("_other_prompt", other)):
            eng.reset()
            want[name] = eng.prefill(p).float()
        eng.grouped_tile, eng.moe_prefill_graphs = (tiles or [None])[0], "graph" in parts
        out = {"grouped_tile": vars(eng.grouped_tile) if eng.grouped_tile else None, "graph": eng.moe_prefill_graphs}
        # a graph's first sighting runs eagerly and captures; the second replays; then another prompt replays
        for name, p in (("", ids), ("", ids), ("_other_prompt", other)):
            eng.reset()
            got = eng.prefill(p).float()
            out.update({f"logits_rel_vs_default{name}": rel(got, want[name]),
                        f"argmax_equal{name}": bool(int(got.argmax()) == int(want[name].argmax()))})
        for n in lengths:
            out[f"pp{n}"] = time_prefill(eng, n, runs)
        return out
    finally:
        for k in ("grouped_tile", "moe_prefill_graphs"):
            if k in own:
                setattr(eng, k, own[k])
            else:
                delattr(eng, k)


def prompt(eng, n: int, seed: int | None = None) -> torch.Tensor:
    """The n-token prompt every prefill of this bench times (seeded by its length unless `seed`)."""
    return torch.randint(0, eng.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n if seed is None
                                                                                               else seed))


def time_prefill(eng, n: int, runs: int) -> dict:
    ids = prompt(eng, n)
    eng.reset()
    eng.prefill(ids)  # warm-up / compile
    samples = []
    for _ in range(runs):
        eng.reset()
        eng.synchronize()
        t = time.perf_counter()
        eng.prefill(ids)
        eng.synchronize()
        samples.append(n / (time.perf_counter() - t))
    return {"tokens": n, **spread(samples)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="35b-a3b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prefill", default="512,4096")
    ap.add_argument("--work", default=".cache/bench")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (tiny shapes)")
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--synth-only", action="store_true", help="make the file and stop (while llama-bench builds)")
    ap.add_argument("--reuse", action="store_true",
                    help="time the file --work already holds (its sha256 read from it), else make it")
    ap.add_argument("--variants", default="", help="comma list of decode variants DENSE+EXPERT to time after the "
                    "default (see time_variant), e.g. x8q6_4x2w1+s16d16w4split")
    ap.add_argument("--prefill-variants", default="", help="comma list of MoE prefill variants to time at every "
                    "--prefill length: graph, a GroupedTile name (bm16bn64w4), or both (graph+bm16bn64w4)")
    ap.add_argument("--ref-positions", type=int, default=128,
                    help="positions of the fp32-reference KL check (weights made on use); 0 = none")
    args = ap.parse_args(argv)
    import os

    from runtime.config import SHAPES, MoeConfig
    moe_shapes = sorted(n for n, c in SHAPES.items() if isinstance(c, MoeConfig))
    if args.shape not in moe_shapes:
        ap.error(f"--shape {args.shape!r} is not a MoE shape: one of {', '.join(moe_shapes)}")

    out = Path(args.out or os.environ.get("OUT", "bench/receipts"))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    rec = Receipt(out / f"moe-{args.shape}-{stamp}.json", {"kind": "moe_bench", "started": _now(),
                                                           "argv": sys.argv[1:], "env": environment(), "errors": {}})
    rec.save()
    r, secs = rec.data, {}
    r["seconds"] = secs

    def step(name, fn):
        t0 = time.perf_counter()
        try:
            r[name] = fn()
        except Exception as e:
            r["errors"][name] = _err(e)
            traceback.print_exc()
        secs[name] = round(time.perf_counter() - t0, 2)
        rec.save()
        print(f"[{name}] {secs[name]} s: {r.get(name, r['errors'].get(name))}", flush=True)
        return r.get(name)

    from runtime.gguf import load_gguf
    from runtime.gguf.writer import file_sha256
    from runtime.synth.factory import synthesize
    from runtime.triton.engine import TritonEngine

    path = Path(args.work) / f"qwen35moe-{args.shape}-q4_k_m-seed{args.seed}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    if args.reuse and path.exists():
        syn = step("reused", lambda: {"path": str(path), "bytes": path.stat().st_size, "gguf_sha256": file_sha256(path)})
    else:
        syn = step("synth", lambda: (lambda s: {"path": str(s.path), "bytes": s.nbytes, "gguf_sha256": s.sha256,
                                                "timings": s.timings})(
            synthesize(args.shape, "q4_k_m", args.seed, path, device=args.device)))
    if syn is None or args.synth_only:
        return 0 if syn else 1
    model = load_gguf(path)
    r["config"] = model.config.to_dict()
    max_ctx = max(int(n) for n in args.prefill.split(",")) + 256
    holder = {}

    def load():
        holder["eng"] = TritonEngine(model, device=args.device, max_context=max_ctx)
        return {"max_context": max_ctx}

    step("load", load)
    eng = holder.get("eng")
    if eng is None:
        return 1
    r["weights_bytes"] = eng.weights.nbytes
    r["decode_weight_bytes_per_token"] = eng.weights.decode_bytes_per_token()
    DEV[0] = args.device
    step("kernel_checks", lambda: kernel_checks(eng))
    step("layer_check", lambda: layer_check(eng, model))

    if args.ref_positions:
        from bench.runtime.decode import reference_check

        step("reference_check", lambda: reference_check(eng, seeds=(0, 1), positions=args.ref_positions))
    step("tg128@0", lambda: time_tg(eng, 0, args.runs, n_tokens=args.tg))
    for n in args.prefill.split(","):
        step(f"pp{n}", lambda n=int(n): time_prefill(eng, n, args.runs))
    for v in filter(None, args.variants.split(",")):
        step(f"variant {v}", lambda v=v: time_variant(eng, model, v, max_ctx, args))
    lengths = [int(n) for n in args.prefill.split(",")]
    for t in filter(None, args.prefill_variants.split(",")):
        step(f"prefill variant {t}", lambda t=t: prefill_variant(eng, t, lengths, args.runs))
    r["finished"] = _now()
    rec.save()
    print("receipt:", rec.path)
    for key in ["tg128@0", *(f"pp{n}" for n in args.prefill.split(","))]:
        v = r.get(key)
        print(f"{key:>10}: " + (f"median {v['median']:.1f} tok/s, spread {v['spread_pct']:.1f}% over {len(v['samples'])}"
                                if v else f"not measured ({r['errors'].get(key)})"))
    for v in filter(None, args.variants.split(",")):
        got = r.get(f"variant {v}") or {}
        tg, rc = got.get("tg128@0"), got.get("reference_check") or {}
        print(f"{v:>32}: " + (f"tg128 {tg['median']:.1f} tok/s, KL {rc.get('kl_mean', float('nan')):.2e} "
                              f"top-1 {rc.get('top1', float('nan')):.3f}" if tg else "not measured"))
    for t in filter(None, args.prefill_variants.split(",")):
        got = r.get(f"prefill variant {t}") or {}
        print(f"{t:>32}: " + (", ".join(f"pp{n} {got[f'pp{n}']['median']:.0f}" for n in lengths if f"pp{n}" in got)
                              + f" tok/s, logits rel {got.get('logits_rel_vs_default', float('nan')):.1e}"
                              + f" (another prompt {got.get('logits_rel_vs_default_other_prompt', float('nan')):.1e})"
                              if got else "not measured"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
