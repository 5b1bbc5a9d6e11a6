"""Prefill benchmark for the Triton path (GPU box). One model at a time, every step in try/except.

Measures, per model: pp<L> tokens/s and TTFT (wall time of one prefill call incl. the LM head,
synchronised) for each length, peak device memory per length, the TTFT of a second turn with
and without session reuse, and kernel-level numbers at the real shapes (GEMM TFLOP/s vs cuBLAS
bf16 on the same shape, chunked GDN µs/layer vs fla, flash attention), with kernel correctness
vs the naive.py references. Median of n ≥ 5 after warm-up (fewer only for the longest lengths,
and then n says so), spread = (max − min) / median.

First (for --check-models, default 0.8b) the prefill logits are checked against the fp32 reference
forward at the real shape (KL, top-1, finiteness; every GEMM mode, one chunk and 128-token chunks).
ONE receipt JSON per invocation, rewritten after every measurement: <--out or $OUT or
bench/receipts>/prefill-<models>-<utc>.json (git commit from .git, else $TOKENGATE_COMMIT).
A compact summary table is the last stdout lines.

Example (one device call, ~5–8 min):
  python bench/runtime/prefill.py --models 9b --lengths 512,4096,32768 --kernels
Models come from --gguf NAME=PATH, else <workdir>/qwen35-<shape>-q4_k_m-seed0.gguf made by
`python -m runtime.cli synth --shape <shape> --quant q4_k_m --seed 0 -o …` (run through
TritonEngine), else (synth failed) random Q4_K_M-typed weights generated on the device in a
prefill-only stand-in engine (speed does not depend on weight values; the receipt says which).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from runtime.gguf.writer import file_sha256 as sha256  # noqa: E402

LLAMACPP = {  # llama.cpp tok/s on the same synthetic files, bench/anchors/llamacpp-h200-anchor.json
    "0.8b": {512: 30610.0, 4096: 31155.0, 32768: 28804.7},
    "4b": {512: 11254.6, 4096: 11787.8, 32768: 10945.2},
    "9b": {512: 8302.2, 4096: 8413.4, 32768: 8003.3},
}
SAME_CALL_LLAMA: dict = {}  # --llama-cpp: {shape: {tokens: record}} (bench/llamacpp/llamacpp_receipt.py), "receipt": its name


def llama_ref(shape: str, tokens: int, gguf_sha256: str | None) -> tuple[float | None, object]:
    """llama.cpp's pp tok/s for this file and length, and where it came from: the same call's llama-bench
    on this very file (sha256 equal), else the anchor (another run), else none."""
    same = SAME_CALL_LLAMA.get(shape, {}).get(tokens)
    if same and gguf_sha256 and same.get("gguf_sha256") == gguf_sha256:
        return same["median"], {"receipt": SAME_CALL_LLAMA["receipt"], "gguf_sha256": gguf_sha256, "n": same.get("n"),
                                "spread_pct": same.get("spread_pct")}
    ref = LLAMACPP.get(shape, {}).get(tokens)
    return ref, ("anchor: bench/anchors/llamacpp-h200-anchor.json" if ref else None)


FLA_US = {  # fla chunk_gated_delta_rule µs/layer (hv -> T -> µs), bench/anchors/fla-gdn-h200.json
    16: {512: 53.8, 4096: 189.3, 32768: 1369.3},
    32: {512: 62.9, 4096: 272.8, 32768: 2059.6},
}


def _summary(samples: list[float]) -> dict:
    med = statistics.median(samples)
    return {"n": len(samples), "median": med, "min": min(samples), "max": max(samples),
            "spread": (max(samples) - min(samples)) / med if med else None, "samples": samples}


DEVICE = "cuda"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _peak() -> int | None:
    return torch.cuda.max_memory_allocated() if DEVICE == "cuda" else None


def _cuda_time(fn, n: int, warmup: int = 2) -> dict:
    """Median µs of fn() over n runs, CUDA events, after warm-up (perf_counter on a CPU smoke run)."""
    for _ in range(warmup):
        fn()
    _sync()
    out = []
    if DEVICE != "cuda":
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        return _summary(out)
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return _summary(out)


def _env() -> dict:
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda}
    info["commit"] = os.environ.get("TOKENGATE_COMMIT") or None  # the coordinator's word wins: the device
    # copy's .git can hold a stale HEAD (seen 2026-12-01: HEAD 5890a1a while the tree sent was 7067b94)
    if info["commit"]:
        info["commit_source"] = "env TOKENGATE_COMMIT"
    elif (ROOT / ".git").exists():
        try:
            r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                               timeout=10)
            sha = r.stdout.strip()
            # A copy with an empty .git answers "HEAD" and fails: only a real SHA counts.
            info["commit"] = sha if r.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", sha) else None
        except Exception as e:  # noqa: BLE001
            info["commit_reason"] = repr(e)
    if info["commit"] is None:  # the device copy has no .git: the coordinator passes the commit
        info["commit"] = os.environ.get("TOKENGATE_COMMIT") or None
        info["commit_source"] = "env TOKENGATE_COMMIT" if info["commit"] else "unknown: no .git and no TOKENGATE_COMMIT"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            info["driver_clocks"] = q.stdout.strip()
        except Exception as e:  # noqa: BLE001
            info["driver_clocks"], info["driver_reason"] = None, repr(e)
    return info


class Receipt:
    """ONE JSON file per invocation (a device call returns only a few files): <out>/prefill-<models>-<utc>.json,
    out = --out, else $OUT, else bench/receipts. Rewritten after every measurement so a crash keeps what ran."""

    def __init__(self, args):
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        out = args.out or os.environ.get("OUT") or str(ROOT / "bench" / "receipts")
        models = args.models.replace(",", "_")
        self.path = Path(out) / f"prefill-{models}-{stamp}.json"
        self.data = {"kind": "prefill_bench", "env": _env(), "args": vars(args), "models": {}}
        self.cur = None

    def model(self, shape: str) -> None:
        self.cur = self.data["models"].setdefault(shape, {"results": [], "errors": []})
        self.save()

    def add(self, rec: dict) -> None:
        self.cur["results"].append(rec)
        self.save()

    def error(self, what: str, e: BaseException) -> None:
        self.cur["errors"].append({"what": what, "error": repr(e)[:500], "trace": traceback.format_exc()[-2000:]})
        print(f"[error] {what}: {e!r}", flush=True)
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


# -- models --------------------------------------------------------------------------------


def _model_file(shape: str, args) -> Path | None:
    """--gguf NAME=PATH, else the synthetic Q4_K_M file (same name and place as bench/runtime/decode.py's, so
    one bench reuses the other's files on a warm machine), made by the synth CLI when missing."""
    for spec in args.gguf or []:
        name, _, path = spec.partition("=")
        if name == shape:
            return Path(path)
    out = Path(args.workdir) / f"qwen35-{shape}-q4_k_m-seed0.gguf"
    if (out.exists() and out.stat().st_size > 0) or args.no_synth:
        return out if out.exists() else None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    base = [sys.executable, "-m", "runtime.cli", "synth", "--shape", shape, "--quant", "q4_k_m", "--seed", "0", "-o", str(tmp)]
    for cmd in ([*base, "--device", DEVICE, "--quiet"], base):
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if r.returncode == 0 and tmp.exists():
            tmp.rename(out)
            return out
    print(f"[synth] {' '.join(base)} failed ({r.returncode}): {r.stderr[-500:]}", flush=True)
    return None


def load_model(shape: str, args, receipt: Receipt, max_context: int):
    from runtime.config import shape as cfg_of
    from runtime.triton.engine import load_triton_engine
    from runtime.triton.standin import random_engine

    path = _model_file(shape, args)
    t0 = time.perf_counter()
    if path is not None:
        eng = load_triton_engine(path, device=DEVICE, max_context=max_context)
        receipt.cur["engine"] = "TritonEngine"
        receipt.cur["gguf"] = {"path": str(path), "sha256": sha256(path), "bytes": path.stat().st_size}
    else:
        eng = random_engine(cfg_of(shape), DEVICE, max_context, seed=0)
        receipt.cur["engine"] = "StandInEngine (prefill only)"
        receipt.cur["gguf"] = {"path": None, "sha256": None,
                                "reason": "no GGUF and no synth CLI: random Q4_K_M-typed weights generated on the device"}
    _sync()
    receipt.cur["load_s"] = time.perf_counter() - t0
    receipt.cur["config"] = eng.config.to_dict()
    receipt.cur["weights_bytes"] = eng.weights.nbytes
    receipt.cur["state_bytes"] = eng.state.nbytes
    return eng


# -- end-to-end prefill ----------------------------------------------------------------------------


def _prefill_once(eng, ids) -> float:
    eng.reset()
    _sync()
    t0 = time.perf_counter()
    logits = eng.prefill(ids)
    _sync()
    dt_s = time.perf_counter() - t0
    if not torch.isfinite(logits).all():
        # rerun once with per-layer probes so the receipt names the first layer/buffer that went bad
        eng.reset()
        eng.prefill_debug = True
        try:
            eng.prefill(ids)
            where = "probed rerun: every layer finite, only the logits are not"
        except FloatingPointError as e:
            where = str(e)
        finally:
            eng.prefill_debug = False
        raise FloatingPointError(f"non-finite logits; {where}")
    return dt_s


def bench_lengths(eng, shape: str, args, receipt: Receipt, mode: str) -> None:
    from runtime.triton.prefill import plan_chunk

    gen = torch.Generator().manual_seed(1)
    vocab = min(eng.config.vocab_size, 248000)
    if args.graphs:  # the eager side of the eager-vs-graph comparison (graphs are the runtime's default)
        eng.prefill_graphs_enabled = False
    for L in args.lengths:
        try:
            if L > eng.max_context:
                raise ValueError(f"length {L} > max_context {eng.max_context}")
            ids = torch.randint(0, vocab, (L,), generator=gen).tolist()
            n = args.n if L <= 8192 else (args.n_long if L <= 65536 else args.n_huge)
            _prefill_once(eng, ids)  # warm-up (compiles every kernel variant at this length)
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times = [_prefill_once(eng, ids) for _ in range(n)]
            s = _summary(times)
            rec = {"what": "prefill", "tokens": L, "gemm": mode, "chunk": plan_chunk(eng, L), "graph": _replayed(eng, L, mode),
                   "ttft_s": s, "tok_s": L / s["median"], "peak_bytes": _peak()}
            ref, src = llama_ref(shape, L, (receipt.cur.get("gguf") or {}).get("sha256"))
            rec.update(llamacpp_tok_s=ref, llamacpp_source=src, ratio_vs_llamacpp=rec["tok_s"] / ref if ref else None)
            receipt.add(rec)
            print(f"[pp{L} {mode}{'+graph' if rec['graph'] else ''}] {rec['tok_s']:.0f} tok/s  ttft {s['median']*1e3:.1f} ms  n={n} spread {s['spread']:.3f} "
                  f"peak {(rec['peak_bytes'] or 0)/2**30:.2f} GiB", flush=True)
            if args.graphs:
                bench_graph(eng, shape, L, ids, n, mode, receipt)
        except Exception as e:  # noqa: BLE001
            receipt.error(f"pp{L}", e)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    if args.graphs:  # what follows (the second turn) runs on the runtime's default again
        del eng.prefill_graphs_enabled


def _replayed(eng, L: int, mode: str) -> bool:
    """Whether the prefill of L tokens at position 0 now replays a captured graph (the runtime's default)."""
    graphs = getattr(eng, "prefill_graphs", None)
    from runtime.triton.prefill_graph import ENABLED

    return bool(getattr(eng, "prefill_graphs_enabled", ENABLED) and graphs is not None
                and graphs.graphs.get((L, 0, mode)) is not None)


def bench_graph(eng, shape: str, L: int, ids: list[int], n: int, mode: str, receipt: Receipt) -> None:
    """The same prefill replayed from a CUDA graph (runtime/triton/prefill_graph.py): its logits against
    the eager ones (they must be equal: the same kernels on the same buffers), then its time."""
    eng.reset()
    eager = eng.prefill(ids).clone()
    eager_next = _decode_after(eng, eager)
    eng.prefill_graphs_enabled = True
    try:
        _prefill_once(eng, ids)  # the first sighting of (L, 0) runs eagerly, then captures
        eng.reset()
        replayed = eng.prefill(ids)
        replayed_next = _decode_after(eng, replayed)  # the state the graph left must be the eager one
        captured = _replayed(eng, L, mode)
        diff = float((replayed - eager).abs().max())
        diff_next = float((replayed_next - eager_next).abs().max())
        times = [_prefill_once(eng, ids) for _ in range(n)]
    finally:
        eng.prefill_graphs_enabled = False
    s = _summary(times)
    ref, src = llama_ref(shape, L, (receipt.cur.get("gguf") or {}).get("sha256"))
    rec = {"what": "prefill", "tokens": L, "gemm": mode, "graph": True, "graph_captured": bool(captured),
           "max_abs_diff_vs_eager": diff, "decode_after_max_abs_diff_vs_eager": diff_next, "ttft_s": s, "tok_s": L / s["median"], "peak_bytes": _peak(),
           "llamacpp_tok_s": ref, "llamacpp_source": src, "ratio_vs_llamacpp": L / s["median"] / ref if ref else None}
    receipt.add(rec)
    print(f"[pp{L} {mode}+graph] {rec['tok_s']:.0f} tok/s  ttft {s['median']*1e3:.1f} ms  n={n} "
          f"captured {captured} max|diff| vs eager {diff:.3g}, 4 decode steps after {diff_next:.3g}", flush=True)


def _decode_after(eng, logits: torch.Tensor, steps: int = 4) -> torch.Tensor:
    """The logits of `steps` greedy decode steps after a prefill, stacked: what reads the prefill's state."""
    rows = []
    for _ in range(steps):
        logits = eng.decode(int(logits.argmax())).clone()
        rows.append(logits)
    return torch.stack(rows)


def bench_turn2(eng, args, receipt: Receipt) -> None:
    a_len, b_len = args.turn2
    try:
        gen = torch.Generator().manual_seed(2)
        ids = torch.randint(0, min(eng.config.vocab_size, 248000), (a_len + b_len,), generator=gen).tolist()
        a, b = ids[:a_len], ids[a_len:]
        reuse, full = [], []
        _prefill_once(eng, ids)
        for _ in range(args.n):
            eng.reset()
            eng.prefill(a)
            _sync()
            t0 = time.perf_counter()
            eng.prefill(b)
            _sync()
            reuse.append(time.perf_counter() - t0)
            full.append(_prefill_once(eng, ids))
        rec = {"what": "turn2_ttft", "gemm": eng.prefill_gemm, "turn1_tokens": a_len, "turn2_tokens": b_len,
               "with_reuse_s": _summary(reuse), "without_reuse_s": _summary(full)}
        receipt.add(rec)
        print(f"[turn2 {a_len}+{b_len}] reuse {statistics.median(reuse)*1e3:.1f} ms, full re-prefill "
              f"{statistics.median(full)*1e3:.1f} ms", flush=True)
    except Exception as e:  # noqa: BLE001
        receipt.error("turn2", e)


def reference_check(eng, args, receipt: Receipt) -> dict | None:
    """Prefill (all-position logits) vs the fp32 reference forward on the same dequantized weights, at the
    real shape: mean KL and top-1 over `--check-positions` random tokens per seed, for every GEMM mode
    benched, once as one chunk and once in 128-token chunks. Speed numbers only count when this passes."""
    from bench.runtime.decode import dequantized_weights
    from runtime.models.qwen35_reference import Qwen35Reference

    try:
        ref = Qwen35Reference(eng.config, dequantized_weights(eng), device=eng.device)
        positions = args.check_positions
        wants = {}
        for seed in args.check_seeds:
            g = torch.Generator().manual_seed(seed)
            ids = torch.randint(0, min(eng.config.vocab_size, 248044), (positions,), generator=g)
            wants[seed] = (ids, ref.forward(ids.to(eng.device), ref.new_state(kv_capacity=positions), all_logits=True))
        del ref
        _sync()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        rec = {"what": "reference_check", "positions": positions, "seeds": list(args.check_seeds), "runs": []}
        for mode in dict.fromkeys([*args.gemm, "scratch"]):
            for chunk in (None, 128):
                eng.prefill_gemm, eng.prefill_chunk = mode, chunk
                kls, agree, n, finite = [], 0, 0, True
                for seed, (ids, want) in wants.items():
                    eng.reset()
                    got = eng.prefill(ids.tolist(), all_logits=True)
                    finite &= bool(torch.isfinite(got).all())
                    lp, lq = torch.log_softmax(want.double(), -1), torch.log_softmax(got.double(), -1)
                    kls.append((lp.exp() * (lp - lq)).sum(-1))
                    agree += int((want.argmax(-1) == got.argmax(-1)).sum())
                    n += positions
                kl = torch.cat(kls)
                run = {"gemm": mode, "chunk": chunk or "one", "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                       "top1": agree / n, "finite": finite,
                       "pass": bool(finite and kl.mean() <= 0.01 and agree / n >= 0.98)}
                rec["runs"].append(run)
                print(f"[check {mode} chunk={run['chunk']}] KL {run['kl_mean']:.2e} top1 {run['top1']:.4f} "
                      f"finite {finite} {'PASS' if run['pass'] else 'FAIL'}", flush=True)
        rec["pass"] = all(r["pass"] for r in rec["runs"])
        receipt.add(rec)
        return rec
    except Exception as e:  # noqa: BLE001
        receipt.error("reference_check", e)
        return None
    finally:
        eng.prefill_chunk = None
        eng.reset()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


# -- kernels at real shapes --------------------------------------------------------------------------


def bench_gemms(eng, args, receipt: Receipt) -> None:
    from runtime.kernels.qgemm import dequantize_matrix, qgemm, qgemm_naive

    cfg = eng.config
    layer_gdn, layer_attn = cfg.deltanet_layers[0], cfg.attention_layers[0]
    names = [f"blk.{layer_gdn}.attn_qkv.weight", f"blk.{layer_gdn}.attn_gate.weight", f"blk.{layer_gdn}.ssm_out.weight",
             f"blk.{layer_gdn}.ffn_gate.weight", f"blk.{layer_gdn}.ffn_down.weight", f"blk.{layer_attn}.attn_q.weight",
             f"blk.{layer_attn}.attn_output.weight"]
    for name in names:
        w = eng.weights.mat[name]
        for m in args.gemm_m:
            try:
                x = torch.randn(m, w.cols, device=DEVICE).to(torch.bfloat16)
                out = torch.empty(m, w.rows, device=DEVICE)
                flops = 2.0 * m * w.rows * w.cols
                t_tile = _cuda_time(lambda: qgemm(x, w.data, w.qtype, w.cols, out=out), args.n_kernel)
                scratch = torch.empty(w.rows, w.cols, device=DEVICE, dtype=torch.bfloat16)
                t_deq = _cuda_time(lambda: dequantize_matrix(w.data, w.qtype, w.cols, out=scratch), args.n_kernel)
                dense = scratch.clone()
                t_cublas = _cuda_time(lambda: torch.matmul(x, dense.t()), args.n_kernel)
                sweep = {}
                for spec in args.gemm_configs if m > 256 else []:
                    cfg = {k: int(v) for k, v in (kv.split("=") for kv in spec.split(":"))}
                    try:
                        t = _cuda_time(lambda: qgemm(x, w.data, w.qtype, w.cols, out=out, config=dict(cfg)), args.n_kernel)
                        sweep[spec] = {"us": t["median"], "tflops": flops / t["median"] / 1e6}
                    except Exception as e:  # noqa: BLE001
                        sweep[spec] = {"error": repr(e)[:200]}
                rows = slice(0, min(256, m))
                ref = qgemm_naive(x[rows], w.data, w.qtype, w.cols)
                rel = ((out[rows] - ref).norm() / ref.norm()).item()
                rec = {"what": "gemm", "tensor": name, "qtype": w.qtype.name, "M": m, "N": w.rows, "K": w.cols,
                       "tile_us": t_tile, "tile_tflops": flops / t_tile["median"] / 1e6,
                       "dequant_us": t_deq, "cublas_bf16_us": t_cublas,
                       "cublas_bf16_tflops": flops / t_cublas["median"] / 1e6,
                       "scratch_path_tflops": flops / (t_deq["median"] + t_cublas["median"]) / 1e6,
                       "rel_err_vs_naive": rel, "config_sweep": sweep}
                receipt.add(rec)
                best = max((v.get("tflops", 0), k) for k, v in sweep.items()) if sweep else (None, None)
                print(f"[gemm {name.split('.', 2)[2]} {w.qtype.name} M={m} N={w.rows} K={w.cols}] tile "
                      f"{rec['tile_tflops']:.0f} TFLOP/s, cuBLAS bf16 {rec['cublas_bf16_tflops']:.0f}, scratch path "
                      f"{rec['scratch_path_tflops']:.0f}; rel err {rel:.1e}; best swept {best}", flush=True)
            except Exception as e:  # noqa: BLE001
                receipt.error(f"gemm {name} M={m}", e)


def bench_gdn(eng, args, receipt: Receipt) -> None:
    from runtime.kernels.gdn_chunk import GDNScratch, gdn_chunk, gdn_chunk_naive

    cfg = eng.config
    hk, hv, dk = cfg.n_k_head, cfg.n_v_head, cfg.ssm_head_dim
    cc = 2 * hk * dk + hv * dk
    for T in [256] + args.gdn_t:
        try:
            g = torch.Generator(device=DEVICE).manual_seed(T)
            u = torch.randn(T, cc, device=DEVICE, generator=g)
            alpha = torch.randn(T, hv, device=DEVICE, generator=g)
            b = torch.randn(T, hv, device=DEVICE, generator=g)
            ssm_a = -torch.rand(hv, device=DEVICE, generator=g) * 2 - 0.01
            dt_b = torch.randn(hv, device=DEVICE, generator=g) * 0.5
            state0 = torch.randn(hv, dk, dk, device=DEVICE, generator=g) * 0.1
            state = state0.clone()
            out = torch.empty(T, hv, dk, device=DEVICE)
            scratch = GDNScratch(T, hv, dk, DEVICE)
            if T == 256:  # correctness vs the fp32 token recurrence
                gdn_chunk(u, alpha, b, ssm_a, dt_b, state, n_k_head=hk, out=out, scratch=scratch)
                ref_state = state0.clone()
                ref = gdn_chunk_naive(u, alpha, b, ssm_a, dt_b, ref_state, n_k_head=hk)
                receipt.add({"what": "gdn_correctness", "T": T, "hk": hk, "hv": hv,
                             "o_rel_err": ((out - ref).norm() / ref.norm()).item(),
                             "state_rel_err": ((state - ref_state).norm() / ref_state.norm()).item(),
                             "finite": bool(torch.isfinite(out).all() and torch.isfinite(state).all())})
                print(f"[gdn correctness T=256] {receipt.cur['results'][-1]}", flush=True)
                continue
            t = _cuda_time(lambda: gdn_chunk(u, alpha, b, ssm_a, dt_b, state, n_k_head=hk, out=out, scratch=scratch),
                           args.n_kernel)
            fla = FLA_US.get(hv, {}).get(T)
            receipt.add({"what": "gdn_chunk", "T": T, "hk": hk, "hv": hv, "us_per_layer": t, "fla_us": fla,
                         "ratio_vs_fla": fla / t["median"] if fla else None})
            print(f"[gdn T={T} Hv={hv}] {t['median']:.1f} us/layer (fla {fla})", flush=True)
        except Exception as e:  # noqa: BLE001
            receipt.error(f"gdn T={T}", e)


def bench_attention(eng, args, receipt: Receipt) -> None:
    from runtime.kernels.flash_attn import flash_attn, flash_attn_naive

    cfg = eng.config
    hq, hkv, dh = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    for T in [1024] + args.attn_t:
        try:
            q = torch.randn(T, hq, dh, device=DEVICE).to(torch.bfloat16)
            qg = torch.randn(T, 2 * hq * dh, device=DEVICE)
            kc = torch.randn(T, hkv, dh, device=DEVICE).to(torch.bfloat16)
            vc = torch.randn(T, hkv, dh, device=DEVICE).to(torch.bfloat16)
            out = torch.empty(T, hq * dh, device=DEVICE, dtype=torch.bfloat16)
            if T == 1024:
                flash_attn(q, qg, kc, vc, 0, out=out)
                ref = flash_attn_naive(q, qg, kc, vc, 0)
                receipt.add({"what": "flash_correctness", "T": T, "rel_err": ((out.float() - ref.float()).norm() / ref.float().norm()).item()})
                print(f"[flash correctness T=1024] {receipt.cur['results'][-1]}", flush=True)
                continue
            flops = 4.0 * hq * dh * T * T / 2  # causal: QKᵀ and PV over half the square (useful FLOPs)
            for cfg in (None, dict(BM=64, BN=64, BV=256, num_warps=8, num_stages=2),
                        dict(BM=128, BN=64, BV=128, num_warps=8, num_stages=2)):
                t = _cuda_time(lambda: flash_attn(q, qg, kc, vc, 0, out=out, config=None if cfg is None else dict(cfg)),
                               args.n_kernel)
                receipt.add({"what": "flash_attn", "T": T, "hq": hq, "hkv": hkv, "config": cfg or "default", "us": t,
                             "tflops": flops / t["median"] / 1e6})
                print(f"[flash T={T} {cfg or 'default'}] {t['median']:.0f} us, {flops / t['median'] / 1e6:.0f} TFLOP/s",
                      flush=True)
        except Exception as e:  # noqa: BLE001
            receipt.error(f"flash T={T}", e)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--models", default="0.8b,4b,9b")
    ap.add_argument("--gguf", action="append", help="NAME=PATH of a GGUF to use for model NAME")
    ap.add_argument("--no-synth", action="store_true", help="never call the synth CLI; random weights if no file")
    ap.add_argument("--workdir", default=str(ROOT / ".cache" / "bench"),
                    help="where synthetic GGUFs are made and reused")
    ap.add_argument("--lengths", type=ints, default=[512, 4096, 32768])
    ap.add_argument("--turn2", type=ints, default=[4096, 512], help="turn-1,turn-2 token counts; empty to skip")
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--n-long", type=int, default=3, help="runs for 8k < L <= 64k")
    ap.add_argument("--n-huge", type=int, default=2, help="runs for L > 64k")
    ap.add_argument("--gemm", type=lambda s: [m for m in s.split(",") if m], default=["auto", "tile"],
                    help="prefill GEMM modes to run the lengths with: tile, scratch, auto (comma list)")
    ap.add_argument("--kernels", action="store_true", help="also the kernel-level benches")
    ap.add_argument("--no-e2e", action="store_true", help="only the kernel-level benches")
    ap.add_argument("--gemm-m", type=ints, default=[512, 4096])
    ap.add_argument("--llama-cpp", type=Path, metavar="RECEIPT", default=None,
                    help="bench/llamacpp/llamacpp_receipt.py output made in this call: same-call ratios on the same files")
    ap.add_argument("--graphs", action="store_true",
                    help="time each length eagerly and replayed from a CUDA graph (and check they are equal); "
                         "without it every row is the runtime's default path (graphs where they apply)")
    ap.add_argument("--gdn-t", type=ints, default=[512, 4096, 32768])
    ap.add_argument("--attn-t", type=ints, default=[4096, 32768])
    ap.add_argument("--n-kernel", type=int, default=10)
    ap.add_argument("--gemm-configs", type=lambda s: [c for c in s.split(",") if c],
                    default=["BM=128:BN=128:GROUP_M=8:num_warps=8:num_stages=2",
                             "BM=128:BN=256:GROUP_M=8:num_warps=8:num_stages=3",
                             "BM=64:BN=128:GROUP_M=8:num_warps=4:num_stages=3",
                             "BM=256:BN=128:GROUP_M=8:num_warps=8:num_stages=3"],
                    help="extra qgemm configs timed for M > 256 (':'-separated keys, ','-separated configs)")
    ap.add_argument("--out", default=None, help="directory of the ONE receipt file (default $OUT, else bench/receipts)")
    ap.add_argument("--check-models", default="0.8b",
                    help="models whose prefill is checked against the fp32 reference first (comma list; empty = none)")
    ap.add_argument("--check-positions", type=int, default=512)
    ap.add_argument("--check-seeds", type=ints, default=[0, 1])
    ap.add_argument("--device", default="cuda", help="cpu = a smoke run under the Triton interpreter (tiny shapes)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton import
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("prefill bench needs CUDA (or --device cpu for a smoke run)", file=sys.stderr)
        return 2
    if args.llama_cpp:
        from bench.llamacpp.llamacpp_receipt import pp_by_tokens

        SAME_CALL_LLAMA.update(pp_by_tokens(json.loads(args.llama_cpp.read_text())), receipt=args.llama_cpp.name)
    table, checks = [], {}
    receipt = Receipt(args)
    check_models = [m for m in args.check_models.split(",") if m]
    for shape in [m for m in args.models.split(",") if m]:
        receipt.model(shape)
        eng = None
        try:
            max_ctx = max(args.lengths + [sum(args.turn2), args.check_positions]) + 64
            eng = load_model(shape, args, receipt, max_ctx)
            if shape in check_models:
                rec = reference_check(eng, args, receipt)
                checks[shape] = "error" if rec is None else ("PASS" if rec["pass"] else "FAIL")
            if not args.no_e2e:
                for mode in args.gemm:
                    eng.prefill_gemm = mode
                    bench_lengths(eng, shape, args, receipt, mode)
                eng.prefill_gemm = args.gemm[0]
                if len(args.turn2) == 2:
                    bench_turn2(eng, args, receipt)
            if args.kernels:
                bench_gemms(eng, args, receipt)
                bench_gdn(eng, args, receipt)
                bench_attention(eng, args, receipt)
        except Exception as e:  # noqa: BLE001
            receipt.error(f"model {shape}", e)
        finally:
            del eng
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        for r in receipt.cur["results"]:
            if r["what"] == "prefill":
                table.append((f"{shape}/{r['gemm']}{'+graph' if r.get('graph') else ''}", r["tokens"], r["tok_s"], r["llamacpp_tok_s"], r["ratio_vs_llamacpp"],
                              r["ttft_s"]["median"], (r["peak_bytes"] or 0) / 2**30))
        for e in receipt.cur["errors"]:
            table.append((f"{shape}/ERROR", e["what"], e["error"][:60]))
    print(f"\nreceipt: {receipt.path}")
    print("correctness (prefill vs fp32 reference): " + (", ".join(f"{k} {v}" for k, v in checks.items()) or "not run"))
    print("model/gemm   tokens   ours tok/s  llama.cpp  ratio  ttft s  peak GiB")
    for row in table:
        if len(row) == 3:
            print(f"{row[0]:11s} {row[1]}: {row[2]}")
            continue
        shape, L, ours, ref, ratio, ttft, peak = row
        print(f"{shape:11s} {L:7d} {ours:11.0f} {ref or float('nan'):10.0f} {ratio or float('nan'):6.2f} {ttft:7.3f} {peak:8.2f}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
