"""Long-context correctness (issue 17 item 4): the Triton path against the fp32 reference at L positions.

    python bench/runtime/long_context.py --models 0.8b,9b --lengths 32768,131072 --out "$OUT"

Per model and length, on one text-like prompt (the guards' token statistics, worker/guards/scoring.py):
1. every position: the engine's rows for all L positions, from one call when L x vocab fp32 fits in
   --logits-gb, else from calls of --piece tokens (the receipt says which; the default piece is the engine's
   own prefill chunk, so the calls split the prompt where serving does), against the fp32 reference forward
   on the engine's own dequantized weights (so the KL is the kernels' error, not quantization's; the models
   are synthetic), run in --piece-token calls that carry its state; each piece is compared as it comes (KL
   and top-1 on the device), so no side holds L x vocab of reference logits. Every position band must meet
   the bars, not only the mean: drift late in the prompt is what this looks for;
2. the serving path: one engine prefill of L tokens that returns only the last row (what the gates time),
   which must agree with the all-rows path's row L-1 (KL within the bar: a path that skips work when only
   the last row is asked for is far outside it; top-1 is reported); its KL to the reference is reported, not
   gated (one row against a bar meant for a mean);
3. --decode teacher-forced steps after the long prefill on both (the engine's CUDA-graph decode step).
A length whose reference does not fit is recorded as null with the reason, never as a pass; a model that
could not be made or loaded makes the whole receipt's pass null. ONE receipt JSON per invocation, saved
before and after every length (a length cut off by a timeout says so): <--out or $OUT>/long-context-*.json.
--device cpu is a smoke run under the Triton interpreter (tiny shapes)."""
from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

KL_BAR, TOP1_BAR = 0.01, 0.98  # the bars bench/runtime/decode.py and prefill.py hold the short checks to


class Agreement:
    """Running KL(reference || engine) and top-1 agreement over rows, per position band: band i holds the
    positions from bands[i-1] (0 for the first) up to bands[i]; a last bucket holds any past the last end."""

    def __init__(self, bands: list[int]):
        self.ends = sorted(bands)
        k = len(self.ends) + 1
        self.kl_sum, self.agree, self.n = [0.0] * k, [0] * k, [0] * k
        self.kl_max, self.finite = 0.0, True

    def add(self, want, got, pos0: int, rows_per_step: int = 256) -> None:
        import torch

        self.finite &= bool(torch.isfinite(got).all())
        ends = torch.tensor(self.ends)
        for a in range(0, want.shape[0], rows_per_step):  # float64 softmaxes a few rows at a time
            w, g = want[a:a + rows_per_step].double(), got[a:a + rows_per_step].double()
            lp, lq = torch.log_softmax(w, -1), torch.log_softmax(g, -1)
            kl = (lp.exp() * (lp - lq)).sum(-1).cpu()
            same = (w.argmax(-1) == g.argmax(-1)).cpu()
            km = float(kl.max())  # torch's max keeps a NaN; Python's max() would drop it
            self.kl_max = float("nan") if math.isnan(km) or math.isnan(self.kl_max) else max(self.kl_max, km)
            band = torch.bucketize(torch.arange(pos0 + a, pos0 + a + kl.numel()), ends, right=True)
            for i in band.unique().tolist():
                sel = band == i
                self.kl_sum[i] += float(kl[sel].sum())
                self.agree[i] += int(same[sel].sum())
                self.n[i] += int(sel.sum())

    def summary(self) -> dict:
        n = sum(self.n)
        if not n:
            return {"positions": 0, "pass": None, "why": "no rows compared"}
        kl_mean, top1 = sum(self.kl_sum) / n, sum(self.agree) / n
        bands = [{"below": self.ends[i] if i < len(self.ends) else None, "kl_mean": _num(s / m), "top1": a / m,
                  "positions": m, "pass": bool(s / m <= KL_BAR and a / m >= TOP1_BAR)}
                 for i, (s, a, m) in enumerate(zip(self.kl_sum, self.agree, self.n)) if m]
        ok = self.finite and kl_mean <= KL_BAR and top1 >= TOP1_BAR and all(b["pass"] for b in bands)
        return {"positions": n, "kl_mean": _num(kl_mean), "kl_max": _num(self.kl_max), "top1": top1,
                "finite": self.finite, "bands": bands, "pass": bool(ok)}


def _one_row(want, got, pos: int) -> dict:
    """Agreement's summary for one position's row."""
    a = Agreement([pos + 1])
    a.add(want[None], got[None], pos)
    return a.summary()


def _num(x: float) -> float | None:
    """NaN is not JSON: a non-finite KL is null (and never passes: NaN compares false above)."""
    return x if x == x and abs(x) != float("inf") else None


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def check_length(eng, ref, ids: list[int], L: int, args) -> dict:
    """Steps 1-3 of the module docstring for one prompt of L (+ --decode) tokens."""
    import torch

    dev = args.device
    rec: dict = {"tokens": L, "decode_steps": args.decode, "piece": args.piece}
    prompt = torch.tensor(ids[:L], dtype=torch.int64)
    vocab = eng.config.vocab_size
    one_call = L * vocab * 4 <= args.logits_gb * (1 << 30)
    rec["engine_rows"] = "one call" if one_call else f"calls of {args.piece} tokens"
    eng.reset()
    _sync(dev)
    t0 = time.perf_counter()
    whole = eng.prefill(prompt, all_logits=True) if one_call else None
    _sync(dev)
    engine_s, reference_s = time.perf_counter() - t0, 0.0
    state = ref.new_state(kv_capacity=L + args.decode)
    bands = [b for b in (4096, 16384, 32768, 65536, 131072) if b < L] + [L]
    rows = Agreement(bands)
    t_all = time.perf_counter()
    for a in range(0, L, args.piece):
        b = min(a + args.piece, L)
        t0 = time.perf_counter()
        want = ref.forward(prompt[a:b].to(ref.device), state, all_logits=True)
        _sync(dev)
        t1 = time.perf_counter()
        got = whole[a:b] if one_call else eng.prefill(prompt[a:b], all_logits=True)
        _sync(dev)
        reference_s, engine_s = reference_s + t1 - t0, engine_s + time.perf_counter() - t1
        rows.add(want, got.float(), a)
        want_last, rows_last = want[-1].clone(), got[-1].float().clone()
        del want, got
    rec["all_positions"] = rows.summary()
    rec["seconds"] = {"reference": round(reference_s, 3), "engine_rows": round(engine_s, 3),
                      "all_positions": round(time.perf_counter() - t_all, 3)}
    del whole
    _free(dev)

    steps = Agreement([L + args.decode])
    for i, t in enumerate(ids[L:L + args.decode]):
        want = ref.forward(torch.tensor([t], device=ref.device), state, all_logits=True)
        steps.add(want, eng.decode(int(t))[None].float(), L + i)
    rec["decode_after"] = steps.summary()

    eng.reset()  # the serving path last: warm (compiled, workspace made), so its time is the call's own
    _sync(dev)
    t0 = time.perf_counter()
    serving_last = eng.prefill(prompt, all_logits=False).float()
    _sync(dev)
    rec["seconds"]["serving_prefill_warm"] = round(time.perf_counter() - t0, 3)
    same = _one_row(rows_last, serving_last, L - 1)
    to_ref = _one_row(want_last, serving_last.to(want_last.device), L - 1)
    same_kl = same["kl_mean"]
    rec["serving_last_row"] = {"kl_to_all_rows_path": same_kl, "same_top1": same["top1"] == 1,
                               "kl_to_reference_reported_not_gated": to_ref["kl_mean"],
                               "top1_to_reference": to_ref["top1"] == 1,
                               "pass": bool(same_kl is not None and same_kl <= KL_BAR)}
    parts = [rec["all_positions"], rec["serving_last_row"], rec["decode_after"]]
    rec["pass"] = all(p["pass"] for p in parts)
    if dev == "cuda":
        rec["peak_gpu_bytes_engine_and_reference"] = torch.cuda.max_memory_allocated()  # not the engine alone
    return rec


def run_model(shape: str, args, receipt) -> None:
    import torch

    from bench.runtime.decode import reference_weights, sha256
    from runtime.models.qwen35_reference import Qwen35Reference
    from runtime.triton.engine import load_triton_engine
    from worker.guards.scoring import text_like_ids

    cur = receipt.data["models"].setdefault(shape, {"lengths": {}})
    path = _model_file(shape, args)
    cur["gguf"] = {"path": str(path), "sha256": None if args.no_hash else sha256(path), "bytes": path.stat().st_size}
    longest = max(args.lengths)
    t0 = time.perf_counter()
    eng = load_triton_engine(path, device=args.device, max_context=longest + args.decode)
    cur["load_s"] = round(time.perf_counter() - t0, 2)
    cur["config"] = eng.config.to_dict()
    ref = Qwen35Reference(eng.config, reference_weights(eng), device=eng.device)
    cur["reference_weights_bytes"] = ref.weights_bytes
    cur["reference_weights"] = ref.weights_held
    ids = text_like_ids(eng.config.vocab_size, longest + args.decode, "long-context", args.seed)
    for L in args.lengths:
        cur["lengths"][str(L)] = {"tokens": L, "pass": None, "why": "started, not finished (cut off?)"}
        receipt.save()
        try:
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            cur["lengths"][str(L)] = check_length(eng, ref, ids, L, args)
        except torch.cuda.OutOfMemoryError as e:  # where the reference does not fit: said, not passed
            cur["lengths"][str(L)] = {"tokens": L, "pass": None, "why": f"out of GPU memory: {str(e)[:300]}"}
        except Exception as e:  # noqa: BLE001 - one length's failure is recorded, the others still run
            cur["lengths"][str(L)] = {"tokens": L, "pass": None, "why": f"{type(e).__name__}: {e}"[:500],
                                      "trace": traceback.format_exc()[-1500:]}
        _free(args.device)
        receipt.save()
        r = cur["lengths"][str(L)]
        if "all_positions" in r:
            print(f"[{shape} L={L}] KL {r['all_positions']['kl_mean']} top1 {r['all_positions']['top1']:.4f} "
                  f"decode KL {r['decode_after']['kl_mean']} serving row {r['serving_last_row']['pass']} "
                  f"pass {r['pass']}", flush=True)
        else:
            print(f"[{shape} L={L}] null: {r['why'][:200]}", flush=True)
    del ref, eng
    _free(args.device)


def _model_file(shape: str, args) -> Path:
    from bench.runtime.decode import make_model

    for spec in args.gguf:
        name, _, p = spec.partition("=")
        if name == shape:
            return Path(p)
    return make_model(shape, Path(args.workdir), args.seed)


def overall_pass(results: dict, models: list[str], lengths: list[int]) -> bool | None:
    """Every (model, length) asked for: one that never ran (its model could not be made or loaded, the call
    was cut off) makes the answer null, not a pass."""
    passes = [results.get(m, {}).get("lengths", {}).get(str(L), {}).get("pass") for m in models for L in lengths]
    return None if None in passes else all(passes)


def _tree_commit() -> dict:
    """The commit of the tree as it is on disk (the device's HEAD can be the last landed commit)."""
    try:
        from bench.tree_snapshot import snapshot_commit

        return {"commit": snapshot_commit(ROOT), "why": None}
    except Exception as e:  # noqa: BLE001 - no git here: environment()'s commit and its source stand
        return {"commit": None, "why": f"{type(e).__name__}: {e}"[:200]}


def main(argv=None) -> int:
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="0.8b,9b")
    ap.add_argument("--lengths", type=ints, default=[32768, 131072])
    ap.add_argument("--decode", type=int, default=64, help="teacher-forced decode steps after the long prefill")
    ap.add_argument("--piece", type=int, default=None, help="tokens per reference call (and per engine call when "
                    "all rows do not fit in --logits-gb); default: the engine's largest prefill chunk")
    ap.add_argument("--logits-gb", type=float, default=40.0, help="largest one-call all-position engine output")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gguf", action="append", default=[], metavar="SHAPE=PATH")
    ap.add_argument("--workdir", default=str(ROOT / ".cache" / "bench"))
    ap.add_argument("--out", default=None, help="directory of the receipt (default $OUT, else bench/receipts)")
    ap.add_argument("--no-hash", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu = a smoke run under the Triton interpreter (tiny shapes)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton import
    if args.piece is None:
        from runtime.triton.prefill import MAX_CHUNK

        args.piece = MAX_CHUNK
    if args.piece < 1 or args.decode < 0 or not args.lengths or min(args.lengths) < 1:
        ap.error("--piece >= 1, --decode >= 0 and positive --lengths")
    from bench.runtime.decode import Receipt, _now, environment

    models = [m for m in args.models.split(",") if m]
    out = Path(args.out or os.environ.get("OUT") or ROOT / "bench" / "receipts")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    receipt = Receipt(out / f"long-context-{'_'.join(models)}-{stamp}.json", {
        "kind": "long_context", "created": _now(), "environment": environment(), "tree_commit": _tree_commit(),
        "what": "synthetic models; the reference runs on the engine's own dequantized weights, so the KL is the "
                "kernels' error, not quantization's",
        "config": {k: v for k, v in vars(args).items() if k != "gguf"} | {"kl_bar": KL_BAR, "top1_bar": TOP1_BAR},
        "models": {}})
    for shape in models:
        try:
            run_model(shape, args, receipt)
        except Exception as e:  # noqa: BLE001 - the receipt keeps what ran and why the rest did not
            receipt.data["models"].setdefault(shape, {})["error"] = f"{type(e).__name__}: {e}"[:800]
            receipt.data["models"][shape]["trace"] = traceback.format_exc()[-2000:]
        receipt.save()
    receipt.data["pass"] = overall_pass(receipt.data["models"], models, args.lengths)
    receipt.save()
    print(f"receipt: {receipt.path} pass={receipt.data['pass']}", flush=True)
    return 0 if receipt.data["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
