"""Decode benchmark for the Triton engine on one GPU (run by the coordinator on the device).

  TOKENGATE_COMMIT=<sha> python bench/runtime/decode.py --models 0.8b,4b,9b --gguf 0.8b=PATH ... --out "$OUT"

Per model: makes the synthetic Q4_K_M GGUF (runtime.cli synth), checks kernels against their
naive twins at the real shapes, checks the engine against the fp32 reference (0.8B: KL, top-1,
3 seeds x 256 teacher-forced positions) and graph == eager, times tg128 at each depth (median of
--runs after warm-up, with spread), the achieved weight bandwidth against a copy bandwidth
measured in the same run, tg128 @0 of each engine variant (engine_variant_options: GEMV tile
heuristics, accumulation, Q6_K unpacking, programmatic dependent launch, split GDN step; pick a
subset with --variants; the fastest one with the default's greedy tokens is timed at every depth too),
and (--gemv-tiles) GEMV tile variants per matrix. Every piece runs in its own try/except; ONE receipt
JSON per invocation is rewritten after each piece in --out (default $OUT) beside one log file, and a
compact table is printed last. The git commit comes from env TOKENGATE_COMMIT when there is no .git.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from runtime.gguf.writer import file_sha256 as sha256  # noqa: E402,F401  (benches name files by it)

LLAMA_CPP_TG128 = {  # llama-bench -fa 1 on the same H200 box and synthetic files (notes/gpu-run1.md); 9B: the
    # shared anchor (bench/anchors/llamacpp-h200-anchor.json), the file was not made in that run
    "0.8b": {0: 574.0, 4096: 577.0, 16384: 547.0},
    "4b": {0: 274.0, 4096: 277.0, 16384: 262.0},
    "9b": {0: 212.5, 16384: 209.1},
}

def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:500]


class Receipt:
    """ONE JSON file per invocation, rewritten in place after every piece (a crash keeps what ran)."""

    def __init__(self, path: Path, base: dict):
        self.path, self.data = path, base

    def save(self):
        text = json.dumps(self.data, indent=1, default=str)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(self.path)
        except OSError as e:
            print(f"could not write {self.path}: {e}", file=sys.stderr)


class Tee:
    """Copy a stream into the log file (the device returns only the tail of stdout)."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text):
        self.stream.write(text)
        self.log.write(text)
        return len(text)

    def flush(self):
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def environment() -> dict:
    import triton

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__}
    if os.environ.get("TOKENGATE_COMMIT"):  # the coordinator's word wins: the device copy's .git can hold a
        # stale HEAD (seen 2026-12-01: HEAD 5890a1a while the tree sent was 7067b94)
        env["git_commit"], env["git_commit_source"] = os.environ["TOKENGATE_COMMIT"], "env TOKENGATE_COMMIT"
        return _gpu_env(_tree(env))
    try:
        env["git_commit"] = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                                                    stderr=subprocess.DEVNULL).strip()
        env["git_commit_source"] = "git"
        _tree(env)
    except Exception as e:  # the device copy has no .git: the coordinator passes the commit
        env["git_commit"] = os.environ.get("TOKENGATE_COMMIT") or None
        env["git_commit_source"] = "env TOKENGATE_COMMIT" if env["git_commit"] else None
        if env["git_commit"] is None:
            env["git_commit_reason"] = f"no git ({_err(e)}) and TOKENGATE_COMMIT unset"
    return _gpu_env(env)


def _tree(env: dict) -> dict:
    """The tree that ran, beside the commit (bench/tree_snapshot.py tree_facts)."""
    from bench.tree_snapshot import tree_facts

    env.update(tree_facts(ROOT))
    return env


def _gpu_env(env: dict) -> dict:
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm_count=p.multi_processor_count, gpu_mem_bytes=p.total_memory)
        try:
            env["driver"] = subprocess.check_output(
                ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem", "--format=csv,noheader"],
                text=True).strip()
        except Exception as e:
            env["driver"] = None
            env["driver_reason"] = _err(e)
    return env


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20) -> dict:
    """Device-to-device copy, bytes read + written per second (the yardstick's convention)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    t = statistics.median(times)
    del a, b
    torch.cuda.empty_cache()
    return {"bytes": nbytes, "median_s": t, "TBps": 2 * nbytes / t / 1e12}


def make_model(shape: str, workdir: Path, seed: int) -> Path:
    out = workdir / f"qwen35-{shape}-q4_k_m-seed{seed}.gguf"
    if out.exists() and out.stat().st_size > 0:
        return out
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    base = [sys.executable, "-m", "runtime.cli", "synth", "--shape", shape, "--quant", "q4_k_m", "--seed", str(seed),
            "-o", str(tmp)]
    for cmd in (base + ["--device", "cuda", "--quiet"], base):  # older CLIs lack the flags
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode == 0 and tmp.exists():
            tmp.rename(out)
            return out
    raise RuntimeError(f"synth failed (rc {r.returncode}): {r.stderr[-800:]}")


def rel_err(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


# -- correctness ---------------------------------------------------------------------------


def kernel_checks(eng, attn_ctx: int = 4096) -> dict:
    """Each kernel vs its naive twin on this model's real weights and shapes. The GEMVs run with the
    heuristic tiles and again with the engine's own (its table: int8-x launches among them, whose
    error against the fp32 twin is the int8 rounding of x)."""
    from runtime.kernels.attn_decode import AttnWorkspace, attention_decode, attention_decode_naive
    from runtime.kernels.gdn_decode import gdn_decode_step, gdn_decode_step_naive
    from runtime.kernels.gemv import gemv, gemv_naive

    cfg, w, out = eng.config, eng.weights, {}
    dev = eng.device
    gdn = next(i for i in range(cfg.n_layers) if not cfg.is_attention(i))
    att = cfg.attention_layers[0]
    x = torch.randn(cfg.d_model, device=dev)
    nw = w.vec[f"blk.{gdn}.attn_norm.weight"]
    p = f"blk.{gdn}."
    segs = [w.mat[p + n] for n in ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight")]
    g, u = w.mat[p + "ffn_gate.weight"], w.mat[p + "ffn_up.weight"]
    for tiles, config in (("", None), (" (engine tiles)", eng.step.gemv_config)):
        seen = set()
        for name, m in w.mat.items():  # one matrix per type, smallest first (the naive path dequantizes on the host)
            if m.qtype in seen or name == "token_embd.weight" or m.cols != cfg.d_model:
                continue
            seen.add(m.qtype)
            out[f"gemv {m.qtype.name} {name}{tiles}"] = rel_err(gemv(x, [m], norm_weight=nw, config=config),
                                                                gemv_naive(x, [m], norm_weight=nw))
        cst = torch.randn(cfg.conv_kernel - 1, cfg.conv_channels, device=dev)
        cst2 = cst.clone()
        a = gemv(x, segs, norm_weight=nw, conv_state=cst, conv_weight=w.vec[p + "ssm_conv1d.weight"], config=config)
        b = gemv_naive(x, segs, norm_weight=nw, conv_state=cst2, conv_weight=w.vec[p + "ssm_conv1d.weight"])
        out[f"gemv gdn in-proj 4 segments + conv{tiles}"] = max(rel_err(a, b), rel_err(cst, cst2))
        out[f"gemv gate/up swiglu{tiles}"] = rel_err(gemv(x, [g, u], swiglu=True, config=config),
                                                     gemv_naive(x, [g, u], swiglu=True))
    hv, dk = cfg.n_v_head, cfg.ssm_head_dim
    st = torch.randn(hv, dk, dk, device=dev) * 0.1
    st2 = st.clone()
    proj = torch.randn(cfg.conv_channels + cfg.value_dim + 2 * hv, device=dev)
    y1 = gdn_decode_step(proj, st, w.vec[p + "ssm_a"], w.vec[p + "ssm_dt.bias"], w.vec[p + "ssm_norm.weight"],
                         torch.empty(cfg.value_dim, device=dev), n_k_head=cfg.n_k_head)
    y2 = gdn_decode_step_naive(proj, st2, w.vec[p + "ssm_a"], w.vec[p + "ssm_dt.bias"], w.vec[p + "ssm_norm.weight"],
                               torch.empty(cfg.value_dim, device=dev), n_k_head=cfg.n_k_head)
    out["gdn decode step"] = max(rel_err(y1, y2), rel_err(st, st2))
    q = f"blk.{att}."
    ctx = attn_ctx
    kc = (torch.randn(ctx + 1, cfg.n_kv_head, cfg.head_dim, device=dev) * 0.5).to(torch.bfloat16)
    vc = torch.randn_like(kc, dtype=torch.float32).to(torch.bfloat16)
    kc2, vc2 = kc.clone(), vc.clone()
    projq = torch.randn(cfg.q_proj_dim + 2 * cfg.kv_proj_dim, device=dev)
    pos = torch.tensor([ctx], dtype=torch.int32, device=dev)
    kw = dict(n_head=cfg.n_head, n_kv_head=cfg.n_kv_head, head_dim=cfg.head_dim, rope_dims=cfg.rope_dims,
              rope_base=cfg.rope_base, eps=cfg.rms_eps)
    o1 = attention_decode(projq, w.vec[q + "attn_q_norm.weight"], w.vec[q + "attn_k_norm.weight"], pos, kc, vc,
                          torch.empty(cfg.n_head * cfg.head_dim, device=dev), eng.bufs.attn, **kw)
    o2 = attention_decode_naive(projq, w.vec[q + "attn_q_norm.weight"], w.vec[q + "attn_k_norm.weight"], pos, kc2, vc2,
                                torch.empty(cfg.n_head * cfg.head_dim, device=dev), **kw)
    out[f"attention decode @{ctx}"] = rel_err(o1, o2)
    return out


def dequantized_one(eng, name: str) -> torch.Tensor:
    """fp32 copy of one engine tensor, dequantized on the GPU by the embed kernel (tested vs gguf's dequantizer)."""
    from runtime.kernels.embed import embed

    if name in eng.weights.vec:
        return eng.weights.vec[name].clone()
    m = eng.weights.mat[name]
    ids = torch.arange(m.rows, dtype=torch.int32, device=eng.device)
    return embed(m, ids, torch.empty(m.rows, m.cols, device=eng.device))


def dequantized_weights(eng) -> dict:
    """fp32 copies of every tensor the reference reads, all resident, in its shapes (expert stacks [E, rows, cols])."""
    from runtime.gguf.names import expected_tensors

    return {name: dequantized_one(eng, name).reshape(shape) for name, shape in expected_tensors(eng.config).items()}


def reference_weights(eng, on_use: bool | None = None):
    """The fp32 reference's weights: resident, or made on use (WeightsOnUse) where the resident copy would take
    more than half the GPU memory still free (the 27B's 108 GB; the 9B's 36 GB beside 32k rows of logits).
    None decides by that rule; the answer is in the returned object's type."""
    from runtime.gguf.names import expected_tensors
    from runtime.models.qwen35_reference import WeightsOnUse

    shapes = expected_tensors(eng.config)
    if on_use is None:
        fp32 = 4 * sum(math.prod(s) for s in shapes.values())
        on_use = eng.device.type == "cuda" and fp32 > torch.cuda.mem_get_info(eng.device)[0] // 2
    if on_use:
        return WeightsOnUse(shapes, lambda name: dequantized_one(eng, name), eng.device)
    return dequantized_weights(eng)


def reference_check(eng, seeds=(0, 1, 2), positions: int = 256) -> dict:
    """Engine decode (teacher-forced, graph) vs the fp32 reference forward: mean KL, top-1 agreement."""
    from runtime.models.qwen35_reference import Qwen35Reference

    ref = Qwen35Reference(eng.config, reference_weights(eng), device=eng.device)
    held = ref.weights_held
    kls, agree, n = [], 0, 0
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, min(eng.config.vocab_size, 248044), (positions,), generator=g)
        eng.reset()
        got = torch.stack([eng.decode(int(t)) for t in ids])
        st = ref.new_state(kv_capacity=positions)
        want = ref.forward(ids.to(eng.device), st, all_logits=True)
        lp, lq = torch.log_softmax(want.double(), -1), torch.log_softmax(got.double(), -1)
        kls.append((lp.exp() * (lp - lq)).sum(-1))
        agree += int((want.argmax(-1) == got.argmax(-1)).sum())
        n += positions
        del want, got, st
    kl = torch.cat(kls)
    del ref
    if eng.device.type == "cuda":
        torch.cuda.empty_cache()
    eng.reset()
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1": agree / n, "positions": n,
            "seeds": list(seeds), "pass": bool(kl.mean() <= 0.01 and agree / n >= 0.98), "reference_weights": held}


def graph_vs_eager(model, max_context: int, **options) -> dict:
    from runtime.triton.engine import TritonEngine

    res = {}
    engs = {k: TritonEngine(model, "cuda", max_context, use_graph=k == "graph", **options) for k in ("eager", "graph")}
    for e in engs.values():
        e.decode(11)
    ids = {k: e.generate_greedy(64) for k, e in engs.items()}
    res["equal_tokens"] = ids["eager"] == ids["graph"]
    res["equal_logits"] = bool(torch.equal(engs["eager"].bufs.logits, engs["graph"].bufs.logits))
    del engs
    torch.cuda.empty_cache()
    return res


# -- timing ---------------------------------------------------------------------------------


def set_depth(eng, depth: int, method: dict) -> None:
    """Bring the engine to `depth`: real prefill when it works, else a synthetic KV fill.

    Decode speed depends on the KV length, not the values, so random K/V rows (and the GDN
    state as it stands) time the same kernels. A failing prefill (any exception: e.g. the
    4B GDN scan's shared-memory limit) switches this model to the synthetic fill for good;
    the method and the reason land in every tg128 record.
    """
    eng.reset()
    if depth == 0:
        eng.decode(1)
        return
    if method.get("kind") != "synthetic_kv":
        try:
            g = torch.Generator().manual_seed(depth)
            eng.prefill(torch.randint(0, min(240000, eng.config.vocab_size), (depth,), generator=g))
            method["kind"] = "prefill"
            return
        except Exception as e:
            method.update(kind="synthetic_kv", reason=f"prefill failed: {_err(e)}")
            print(f"set_depth({depth}): prefill failed, synthetic KV fill instead: {_err(e)[:200]}", file=sys.stderr)
            if eng.device.type == "cuda":
                torch.cuda.synchronize()
            eng.reset()
    for kc, vc in zip(eng.state.k_cache, eng.state.v_cache):
        kc[:depth].normal_(0, 0.5)
        vc[:depth].normal_(0, 1.0)
    eng.position = depth
    eng.state.pos.fill_(depth)
    eng.decode(1)


def time_tg(eng, depth: int, runs: int, n_tokens: int = 128, method: dict | None = None) -> dict:
    method = {} if method is None else method
    set_depth(eng, depth, method)
    start = eng.position
    eng.generate_greedy(16)  # warm-up (graph capture on first use)
    samples = []
    for _ in range(runs):
        eng.position = start  # rewind: same KV length every run (GDN state keeps evolving, same cost)
        eng.state.pos.fill_(start)
        eng.synchronize()
        t = time.perf_counter()
        eng.generate_greedy(n_tokens)
        eng.synchronize()
        samples.append(n_tokens / (time.perf_counter() - t))
    return {"depth": depth, "tokens": n_tokens, **spread(samples),
            "depth_method": method.get("kind", "decode"), "depth_method_reason": method.get("reason")}


def spread(samples: list[float]) -> dict:
    """A receipt's figures for repeated timings: the samples, median, min, max, (max - min) / median in %."""
    med = statistics.median(samples)
    return {"samples": samples, "median": med, "min": min(samples), "max": max(samples),
            "spread_pct": 100 * (max(samples) - min(samples)) / med}


def _cfg_list(v, xx, ws, kw):
    from runtime.kernels.gemv.kernel import AutoTile, resolve_config

    c = resolve_config(v, ws, xx.device, kw.get("swiglu", False))
    label = [f"auto-v{v.version}"] if isinstance(v, AutoTile) else []
    return label + [c.block_n, c.block_b, c.num_warps, c.q6, c.pdl, c.acc, c.words]


def gemv_variants(eng) -> dict:
    """Per-kernel timing of GEMV tile variants on this model's matrices (CUDA-graph timed)."""
    import triton.testing as tt

    from runtime.kernels.gemv import GemvConfig, gemv

    cfg, w = eng.config, eng.weights
    gdn = next(i for i in range(cfg.n_layers) if not cfg.is_attention(i))
    p = f"blk.{gdn}."
    x = torch.randn(cfg.d_model, device="cuda")
    xf = torch.randn(cfg.d_ffn, device="cuda")
    nw = w.vec[p + "attn_norm.weight"]
    cases = {
        "ffn_gate+up swiglu": (x, [w.mat[p + "ffn_gate.weight"], w.mat[p + "ffn_up.weight"]], dict(swiglu=True, norm_weight=nw)),
        "ffn_down": (xf, [w.mat[p + "ffn_down.weight"]], {}),
        "gdn in-proj x4": (x, [w.mat[p + n] for n in ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight",
                                                      "ssm_alpha.weight")], dict(norm_weight=nw)),
        "lm_head": (x, [w.lm_head], dict(norm_weight=nw)),
    }
    from runtime.kernels.gemv import AutoTile

    variants = [AutoTile(1, acc=1), AutoTile(1), AutoTile(2, acc=1), AutoTile(2), AutoTile(2, q6=2),
                GemvConfig(8, 2, 4, 2), GemvConfig(8, 4, 8, 2)] + [
        GemvConfig(bn, bb, nw_) for bn, bb, nw_ in (
            (1, 4, 2), (1, 16, 4), (2, 2, 2), (2, 8, 4), (2, 16, 8), (4, 2, 2), (4, 4, 4), (4, 8, 8), (4, 16, 8),
            (8, 1, 4), (8, 2, 4), (8, 2, 8), (8, 4, 8), (16, 1, 4), (16, 2, 8))]
    bench = getattr(tt, "do_bench_cudagraph", None) or tt.do_bench
    out = {}
    for cname, (xx, ws, kw) in cases.items():
        nbytes = sum(m.nbytes for m in ws)
        rows = []
        for v in variants:
            try:
                y = gemv(xx, ws, config=v, **kw)
                ms = bench(lambda: gemv(xx, ws, y, config=v, **kw))
                rows.append({"config": _cfg_list(v, xx, ws, kw), "us": ms * 1e3, "GBps": nbytes / ms / 1e6})
            except Exception as e:
                rows.append({"config": _cfg_list(v, xx, ws, kw), "us": None, "reason": _err(e)})
        ok = [r for r in rows if r["us"] is not None]
        out[cname] = {"bytes": nbytes, "types": [m.qtype.name for m in ws], "variants": rows,
                      "best": min(ok, key=lambda r: r["us"]) if ok else None}
    return out


SAME_RUN_LLAMA_CPP: dict = {}  # --llama-cpp: {shape: {depth: record}, "receipt": name} from llamacpp_receipt.py
TILE_TABLES: dict = {}  # --tile-table: model name -> TileTable measured by bench/profiling/gemv_sweep.py


def engine_variant_options(model_name: str | None = None, max_ctx: int = 32768) -> dict:
    """Named engine options timed against the defaults (tg128 @0 on this model): the flags that
    decide which kernel variant the engine uses, so one GPU run tells which to make default."""
    from runtime.kernels.attn_decode import AttnConfig
    from runtime.kernels.gemv import AutoTile

    table = {}
    if model_name in TILE_TABLES:
        t = TILE_TABLES[model_name]
        table = {"table": {"gemv_config": t}, "table_pdl": {"gemv_config": t.replaced(pdl=True), "gdn_pdl": True}}
    return {
        # word-wise Q4_K/Q6_K unpacking (runtime/kernels/gemv/words.py) with its tile heuristic
        # the byte-wise GEMV (the default before the words path), and the words path with PDL
        "bytes": {"gemv_config": AutoTile(2, words=False)},
        "bytes_pdl": {"gemv_config": AutoTile(2, words=False, pdl=True), "gdn_pdl": True},
        "words_pdl": {"gemv_config": AutoTile(3, words=True, pdl=True), "gdn_pdl": True},
        **table,
        "default": {},
        "attn_pdl": {"pdl": True},  # PDL for the attention (and argmax) launches too
        # the sm_90 tile table with every launch under PDL (GEMVs, GDN step, attention, argmax), with and
        # without the GEMVs' L2 prefetch of their weights before gdc_wait (9B lost 12 % with it)
        "pdl_noprefetch": {"gemv_config": _table_with(pdl=True, prefetch=False), "pdl": True},
        "pdl_prefetch": {"gemv_config": _table_with(pdl=True, prefetch=True), "pdl": True},
        "table_stages1": {"gemv_config": _table_with(num_stages=1)},
        "table_stages2": {"gemv_config": _table_with(num_stages=2)},
        "table_stages4": {"gemv_config": _table_with(num_stages=4)},
        "pdl_noprefetch_stages2": {"gemv_config": _table_with(pdl=True, prefetch=False, num_stages=2), "pdl": True},
        # the decode attention before the 2026-12-01 sweep (bench/profiling/attn_sweep.py): tf32 dots, 64-row
        # blocks, splits = next power of two of min(SMs / Hkv, ctx / 256)
        "attn_before": {"attn_config": AttnConfig(block_t=64, num_warps=4),
                        "n_split": _legacy_n_split(max_ctx, model_name)},
        "gemv_tiles_v1": {"gemv_config": AutoTile(1)},
        "gemv_step_reduce": {"gemv_config": AutoTile(2, acc=1)},
        "gemv_before_this_branch": {"gemv_config": AutoTile(1, acc=1)},
        "gemv_q6_qh_once": {"gemv_config": AutoTile(2, q6=2)},
        "gemv_pdl": {"gemv_config": AutoTile(2, pdl=True)},
        "gemv_pdl_q6_qh_once": {"gemv_config": AutoTile(2, q6=2, pdl=True)},
        "gdn_pdl": {"gdn_pdl": True},
        "gemv_pdl+gdn_pdl": {"gemv_config": AutoTile(2, pdl=True), "gdn_pdl": True},
        "all_pdl": {"gemv_config": AutoTile(2, pdl=True), "pdl": True},
        # Q4_K GEMVs against int8 x (dp4a, runtime/kernels/gemv/q8dot.py): every table entry, or the SwiGLU ones
        "x8": {"gemv_config": _table_with(x8=True)},
        "x8_swiglu": {"gemv_config": _table_with(x8=True, only="swiglu")},
        "x8_q6": {"gemv_config": _table_with(x8=True, x8_q6=True)},  # Q6_K on int8 x as well
        "gdn_split_bv64": {"gdn_block_v": 64},
        "gdn_split_bv32": {"gdn_block_v": 32},
        "gdn_split_bv16": {"gdn_block_v": 16},
        # GEMV K-loop pipelining depth: 1 = no cp.async staging (fewer registers / smem, more
        # programs resident), 4 = one more step of weight bytes in flight per program
        "gemv_stages1": {"gemv_config": AutoTile(2, num_stages=1)},
        "gemv_stages4": {"gemv_config": AutoTile(2, num_stages=4)},
        # twice the rows per program with 8 warps: x (fp32) and the scale unpack amortised over
        # twice the rows, twice the weight bytes per program per K step
        "gemv_bn2_w8": {"gemv_config": AutoTile(2, bn_scale=2, num_warps=8)},
        "gemv_bn2_w8_pdl+gdn_pdl": {"gemv_config": AutoTile(2, bn_scale=2, num_warps=8, pdl=True), "gdn_pdl": True},
    }


def _table_with(only: str | None = None, **fields):
    """The sm_90 default tile table with `fields` replaced (TileTable.replaced)."""
    from runtime.kernels.gemv.tiles import sm90_table

    return sm90_table().replaced(only, **fields)


def _legacy_n_split(max_ctx: int, model_name: str | None) -> int:
    import triton

    from runtime.config import SHAPES

    hkv = SHAPES[model_name].n_kv_head if model_name in SHAPES else 2
    return triton.next_power_of_2(max(1, min(triton.cdiv(132, hkv), triton.cdiv(max_ctx, 256))))


DEFAULT_VARIANTS = "default,gemv_pdl+gdn_pdl,gdn_split_bv32,gemv_stages1,gemv_bn2_w8"


def engine_variants(eng, model, max_ctx: int, names: list[str], runs: int) -> dict:
    """tg128 @0 of each named variant, with its greedy tokens compared to the default engine's."""
    from runtime.triton.engine import TritonEngine

    options = engine_variant_options(model.config.name, max_ctx)
    out = {n: {"tok_s": None, "reason": "no --tile-table for this model"} for n in names if n not in options}
    names = [n for n in names if n in options]
    ref_ids = None
    for name in ["default"] + [n for n in names if n != "default"]:
        opts = options[name]
        e = eng if not opts else None
        t = time.perf_counter()
        try:
            if e is None:
                e = TritonEngine(model, "cuda", max_ctx, **opts)
            e.reset()
            e.decode(11)
            ids = e.generate_greedy(32)
            if ref_ids is None:
                ref_ids = ids
            res = time_tg(e, 0, runs)
            out[name] = {"options": {k: repr(v) for k, v in opts.items()}, "tok_s": res["median"],
                         "spread_pct": res["spread_pct"], "same_tokens_as_default": ids == ref_ids}
        except Exception as ex:
            out[name] = {"options": {k: repr(v) for k, v in opts.items()}, "tok_s": None, "reason": _err(ex)}
            traceback.print_exc()
        finally:
            out[name]["seconds"] = round(time.perf_counter() - t, 1)
            if e is not None and e is not eng:
                del e
                torch.cuda.empty_cache()
    eng.reset()
    return out


def best_variant(variants: dict) -> str:
    """The fastest variant whose greedy tokens equal the default's (default when none beats it)."""
    ok = {n: v for n, v in variants.items() if v.get("tok_s") and (n == "default" or v.get("same_tokens_as_default"))}
    return max(ok, key=lambda n: ok[n]["tok_s"]) if ok else "default"


# -- driver -----------------------------------------------------------------------------------


def time_depths(eng, shape: str, args, r: dict, key: str, step, copy_bw) -> None:
    method: dict = {}
    tg = r.setdefault(key, {})
    for depth in args.depths:
        res = step(f"{key}@{depth}", lambda: time_tg(eng, depth, args.runs, method=method))
        if res is None:
            continue
        tg[str(depth)] = res
        same = SAME_RUN_LLAMA_CPP.get(shape, {}).get(depth)
        if same:
            lc = same["median"]
            res["llama_cpp_source"] = {"receipt": SAME_RUN_LLAMA_CPP["receipt"], "gguf_sha256": same["gguf_sha256"],
                                       "n": same["n"], "spread_pct": same["spread_pct"]}
        else:
            lc = LLAMA_CPP_TG128.get(shape, {}).get(depth)
            res["llama_cpp_source"] = "LLAMA_CPP_TG128 (an earlier run / the anchor)" if lc else None
        res["llama_cpp_tok_s"] = lc
        res["ratio_vs_llama_cpp"] = res["median"] / lc if lc else None
        if copy_bw:
            res["weight_bandwidth_fraction"] = res["median"] * r["decode_weight_bytes_per_token"] / (copy_bw["TBps"] * 1e12)


def run_model(shape: str, args, rec: Receipt, copy_bw: dict | None) -> None:
    from runtime.gguf import load_gguf
    from runtime.triton.engine import TritonEngine

    r = rec.data["models"].setdefault(shape, {"errors": {}})

    def step(name, fn):
        t = time.perf_counter()
        try:
            r[name] = fn()
        except Exception as e:
            r[name] = None
            r["errors"][name] = _err(e)
            traceback.print_exc()
        r.setdefault("seconds", {})[name] = round(time.perf_counter() - t, 2)
        rec.save()
        return r[name]

    path = Path(args.gguf[shape]) if shape in args.gguf else step("gguf_file", lambda: str(make_model(shape, args.workdir, args.seed)))
    if path is None:
        return
    path = Path(path)
    r["gguf_file"] = str(path)
    if not args.no_hash:
        step("gguf_sha256", lambda: sha256(path))
    elif SAME_RUN_LLAMA_CPP.get("sha256_by_path", {}).get(str(path)):  # llama-bench's receipt hashed this file
        r["gguf_sha256"] = SAME_RUN_LLAMA_CPP["sha256_by_path"][str(path)]
        r["gguf_sha256_source"] = SAME_RUN_LLAMA_CPP["receipt"]
    model = load_gguf(path)
    max_ctx = max(max(args.depths) + 128 + 64, args.ref_positions + 64)  # the reference check decodes ref_positions
    eng = TritonEngine(model, "cuda", max_ctx)
    r["config"] = model.config.to_dict()
    r["weights_bytes"] = eng.weights.nbytes
    r["decode_weight_bytes_per_token"] = eng.weights.decode_bytes_per_token()
    r["n_split"] = eng.bufs.attn.n_split
    if not args.skip_checks:
        step("kernel_checks", lambda: kernel_checks(eng))
        step("graph_vs_eager", lambda: graph_vs_eager(model, 512))
        if shape in args.reference_shapes and not args.skip_default_reference:
            step("reference_check", lambda: reference_check(eng, positions=args.ref_positions))
    best = "default"
    if len(args.variants) > 1:
        var = step("engine_variants", lambda: engine_variants(eng, model, max_ctx, args.variants, args.runs))
        if var:
            best = r["best_variant"] = best_variant(var)
    time_depths(eng, shape, args, r, "tg128", step, copy_bw)
    if best != "default":  # the winner at every depth too (one engine at a time: 9B weights twice fit, but why)
        del eng
        torch.cuda.empty_cache()
        eng = TritonEngine(model, "cuda", max_ctx, **engine_variant_options(model.config.name, max_ctx)[best])
        time_depths(eng, shape, args, r, "tg128_best", step, copy_bw)
    for name in args.depth_variants:  # named variants timed at every depth as well (one engine at a time)
        del eng
        torch.cuda.empty_cache()
        opts = engine_variant_options(model.config.name, max_ctx)[name]
        eng = TritonEngine(model, "cuda", max_ctx, **opts)
        if name in args.check_variants:  # the checks the default engine gets, on this variant
            step(f"graph_vs_eager_{name}", lambda: graph_vs_eager(model, 512, **opts))
            if shape in args.reference_shapes:
                step(f"reference_check_{name}", lambda: reference_check(eng, positions=args.ref_positions))
        time_depths(eng, shape, args, r, f"tg128_at_{name}", step, copy_bw)
    if args.gemv_tiles:
        step("gemv_variants", lambda: gemv_variants(eng))
    del eng
    torch.cuda.empty_cache()
    rec.save()


def print_table(rec: Receipt) -> None:
    """Compact summary, printed last (the device returns only the tail of the output)."""
    for shape, r in rec.data["models"].items():
        if r.get("engine_variants"):
            print(f"{shape} variants tg128@0: " + ", ".join(
                f"{n} {v['tok_s']:.1f}{'' if v.get('same_tokens_as_default') else ' (TOKENS DIFFER)'}"
                if v.get("tok_s") else f"{n} FAIL" for n, v in r["engine_variants"].items()))
        if r.get("reference_check"):
            rc = r["reference_check"]
            print(f"{shape}: reference KL {rc['kl_mean']:.2e} top1 {rc['top1']:.4f} pass={rc['pass']}")
        if r.get("kernel_checks"):
            worst = max(r["kernel_checks"].items(), key=lambda kv: kv[1])
            print(f"{shape}: worst kernel rel err {worst[0]} = {worst[1]:.2e}; graph==eager {r.get('graph_vs_eager')}")
        if r.get("errors"):
            print(f"{shape}: errors " + "; ".join(f"{k}: {v[:160]}" for k, v in r["errors"].items()))
    print("\nmodel variant                depth   tok/s   spread%  llama.cpp  ratio  BW-frac  depth-by")
    for shape, r in rec.data["models"].items():
        keys = [("tg128", "default"), ("tg128_best", r.get("best_variant", "-"))]
        keys += [(k, k[len("tg128_at_"):]) for k in r if k.startswith("tg128_at_") and "@" not in k]
        for key, label in keys:
            for depth, t in (r.get(key) or {}).items():
                ratio = f"{t['ratio_vs_llama_cpp']:.2f}" if t.get("ratio_vs_llama_cpp") else "-"
                bw = f"{t['weight_bandwidth_fraction']:.3f}" if t.get("weight_bandwidth_fraction") else "-"
                lc = f"{t.get('llama_cpp_tok_s') or '-'}{'*' if isinstance(t.get('llama_cpp_source'), dict) else ''}"
                print(f"{shape:5} {label[:22]:22} {depth:>6} {t['median']:7.1f}  {t['spread_pct']:6.1f}"
                      f"  {lc:>9}  {ratio:>5}  {bw:>7}  {t.get('depth_method')}")
    if SAME_RUN_LLAMA_CPP:
        print(f"* llama.cpp from {SAME_RUN_LLAMA_CPP['receipt']} (llama-bench on the same GGUF files)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="0.8b,4b,9b")
    ap.add_argument("--depths", default="0,4096,16384")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gguf", action="append", default=[], metavar="SHAPE=PATH", help="use an existing file")
    ap.add_argument("--workdir", type=Path, default=ROOT / ".cache" / "bench")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / ".cache" / "bench-out"),
                    help="folder for the ONE receipt JSON and the log of this run (default $OUT)")
    ap.add_argument("--reference-shapes", default="0.8b")
    ap.add_argument("--ref-positions", type=int, default=256)
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--variants", "--engine-variants", dest="variants", default=DEFAULT_VARIANTS,
                    help="comma list of engine_variant_options() names timed at tg128@0 (greedy tokens checked "
                         "against default); the fastest equal one is then timed at every depth. 'all' = every "
                         f"option, 'default' = none. Default: {DEFAULT_VARIANTS}")
    ap.add_argument("--skip-engine-variants", action="store_true", help="same as --variants default")
    ap.add_argument("--gemv-tiles", action="store_true", help="also time GEMV tile configs per matrix (slow: compiles)")
    ap.add_argument("--skip-variants", action="store_true", help=argparse.SUPPRESS)  # old flag: tiles are opt-in now
    ap.add_argument("--skip-best", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-hash", action="store_true")
    ap.add_argument("--tile-table", action="append", default=[], type=Path, metavar="SWEEP_JSON",
                    help="bench/profiling/gemv_sweep.py output: adds variants 'table' and 'table_pdl' for its model")
    ap.add_argument("--depth-variants", default="", help="comma list of variants also timed at every depth")
    ap.add_argument("--check-variants", default="", help="comma list of --depth-variants that also get graph == eager "
                                                         "and (--reference-shapes) the fp32 reference check")
    ap.add_argument("--skip-default-reference", action="store_true",
                    help="no reference check on the default engine (the --check-variants ones still run)")
    ap.add_argument("--llama-cpp", type=Path, metavar="RECEIPT",
                    help="bench/llamacpp/llamacpp_receipt.py output (made in the same call, for a same-run ratio): "
                         "its tg128 figures for the ratios")
    args = ap.parse_args(argv)
    from runtime.kernels.gemv import TileTable

    if args.llama_cpp:
        from bench.llamacpp.llamacpp_receipt import tg128_by_depth

        lrec = json.loads(args.llama_cpp.read_text())
        SAME_RUN_LLAMA_CPP.update(tg128_by_depth(lrec), receipt=args.llama_cpp.name,
                                  sha256_by_path={r["path"]: r["gguf_sha256"] for r in lrec["results"] if r.get("path")})

    from runtime.kernels.gemv.tiles import sm90_table

    for p in args.tile_table:  # the sweep's tiles over the sm_90 default table (a sweep of some shapes only)
        sweep = json.loads(p.read_text())
        base = sm90_table()
        swept = TileTable.from_dict(sweep["table"])
        merged = dict(base.entries) | dict(swept.entries)
        TILE_TABLES[sweep["model"]] = TileTable(tuple(sorted(merged.items())), base.fallback)
    args.depths = [int(d) for d in args.depths.split(",") if d]
    args.reference_shapes = set(args.reference_shapes.split(","))
    args.gguf = dict(kv.split("=", 1) for kv in args.gguf)
    if args.skip_engine_variants:
        args.variants = "default"
    known = set(engine_variant_options()) | {"table", "table_pdl"}
    names = sorted(known) if args.variants == "all" else [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown --variants {unknown}; known: {', '.join(sorted(known))}")
    args.variants = ["default"] + [n for n in names if n != "default"]
    args.depth_variants = [n for n in args.depth_variants.split(",") if n]
    args.check_variants = [n for n in args.check_variants.split(",") if n]
    if set(args.check_variants) - set(args.depth_variants):
        ap.error("--check-variants must be among --depth-variants")
    if set(args.depth_variants) - known:
        ap.error(f"unknown --depth-variants {sorted(set(args.depth_variants) - known)}")
    if not torch.cuda.is_available():
        print("bench/runtime/decode.py needs a CUDA device", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / f"decode-{stamp}.log", "w", buffering=1)
    sys.stdout, sys.stderr = Tee(sys.__stdout__, log), Tee(sys.__stderr__, log)
    rec = Receipt(args.out / f"decode-{stamp}.json",
                  {"kind": "decode_bench", "started": _now(), "argv": sys.argv[1:], "env": environment(), "models": {}})
    rec.save()
    copy_bw = None
    try:
        copy_bw = copy_bandwidth()
        rec.data["copy_bandwidth"] = copy_bw
    except Exception as e:
        rec.data["copy_bandwidth"] = None
        rec.data["copy_bandwidth_reason"] = _err(e)
    rec.save()
    for shape in [m for m in args.models.split(",") if m]:
        t = time.perf_counter()
        try:
            run_model(shape, args, rec, copy_bw)
        except Exception as e:
            rec.data["models"].setdefault(shape, {"errors": {}})["errors"]["model"] = _err(e)
            traceback.print_exc()
        rec.data["models"].setdefault(shape, {"errors": {}})["total_seconds"] = round(time.perf_counter() - t, 1)
        rec.save()
    rec.data["finished"] = _now()
    rec.save()
    print(f"\nreceipt: {rec.path}  commit: {rec.data['env'].get('git_commit')}  "
          f"copy BW: {copy_bw['TBps']:.2f} TB/s" if copy_bw else f"\nreceipt: {rec.path}")
    print_table(rec)
    sys.stdout.flush()
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
