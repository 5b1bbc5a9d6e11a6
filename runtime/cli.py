"""`tokengate-runtime` command line: synth, info, generate."""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

from .config import SHAPES

BIG_SHAPES = {"0.8b", "2b", "4b", "9b", "27b", "35b-a3b"}


def _err(msg: str) -> int:
    print(f"tokengate-runtime: error: {msg}", file=sys.stderr)
    return 2


def cmd_synth(args) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    from .synth.factory import make_plan, synthesize

    out = Path(args.output)
    if out.parent and not out.parent.exists():
        return _err(f"output directory {out.parent} does not exist")
    try:
        plan = make_plan(args.shape, args.quant, args.seed)
    except ValueError as e:
        return _err(str(e))
    if args.workers < 1:
        return _err("--workers must be at least 1")
    if args.max_inflight_gb <= 0:
        return _err("--max-inflight-gb must be positive")
    total = sum(t.nbytes for t in plan.tensors)
    show = args.shape in BIG_SHAPES and sys.stderr.isatty() and not args.quiet
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), disable=not show, transient=True) as prog:
        task = prog.add_task(f"synth {args.shape} {args.quant} ({args.workers} workers)", total=total)
        try:
            res = synthesize(args.shape, args.quant, args.seed, out, device=args.device,
                             on_tensor=lambda t: prog.advance(task, t.nbytes), workers=args.workers,
                             inflight_bytes=int(args.max_inflight_gb * (1 << 30)))
        except (ValueError, RuntimeError, OSError) as e:
            return _err(str(e))
    print(f"wrote {res.path}  {res.nbytes:,} bytes  sha256 {res.sha256}")
    if args.report:
        from .synth.report import print_report, report

        print_report(report(res.path, device=args.device, n_prompts=args.report_prompts, seed=args.seed))
    return 0


def cmd_info(args) -> int:
    from .gguf import GGUFError, load_gguf
    from .gguf.writer import file_sha256
    from .synth.plan import type_counts

    try:
        m = load_gguf(args.model)
    except GGUFError as e:
        return _err(str(e))
    c = m.config
    print(f"file        {m.path}  {m.path.stat().st_size:,} bytes")
    if not args.no_hash:
        print(f"sha256      {file_sha256(m.path)}")
    print(f"name        {m.metadata.get('general.name')}  file_type {m.file_type}")
    print(f"layers      {c.n_layers} ({len(c.attention_layers)} attention, {len(c.deltanet_layers)} DeltaNet)  d {c.d_model}  ffn {c.d_ffn}  vocab {c.vocab_size}")
    print(f"attention   Hq {c.n_head}  Hkv {c.n_kv_head}  Dh {c.head_dim}  rope {c.rope_dims} dims base {c.rope_base:g}")
    print(f"deltanet    Hk {c.n_k_head}  Hv {c.n_v_head}  d {c.ssm_head_dim}  conv {c.conv_kernel}  tied {c.tied_embeddings}")
    by_type = Counter()
    for t in m.tensors.values():
        by_type[t.type.name] += t.nbytes
    print("bytes/type  " + "  ".join(f"{k} {v:,}" for k, v in sorted(by_type.items())))

    class _T:  # type_counts wants .name/.type
        def __init__(self, t):
            self.name, self.type = t.name, t.type

    for key, counts in type_counts([_T(t) for t in m.tensors.values()]).items():
        print(f"  {key:<36} " + " ".join(f"{k}×{v}" for k, v in counts.items()))
    return 0


def cmd_generate(args) -> int:
    import torch

    import runtime

    if args.prompt_ids is None and args.random_prompt is None:
        return _err("give --prompt-ids or --random-prompt N")
    try:
        engine = runtime.load_engine(args.model, device=args.device)
    except ImportError as e:
        return _err(f"no engine available: {e}")
    except ValueError as e:
        return _err(str(e))
    vocab = engine.config.vocab_size if hasattr(engine, "config") else None
    if args.prompt_ids is not None:
        try:
            ids = [int(x) for x in args.prompt_ids.replace(",", " ").split()]
        except ValueError:
            return _err(f"--prompt-ids must be integers, got {args.prompt_ids!r}")
    else:
        from .synth.report import random_prompts

        ids = random_prompts(vocab or 4096, 1, args.random_prompt, args.seed)[0].tolist()
    if vocab is not None and any(not 0 <= t < vocab for t in ids):
        return _err(f"prompt ids must be in [0, {vocab})")
    engine.reset()
    engine.prefill(torch.tensor(ids))
    out = engine.generate_greedy(args.tokens)
    print(" ".join(str(t) for t in out))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tokengate-runtime", description="Qwen3.5 runtime tools")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("synth", help="write a synthetic qwen35 GGUF")
    s.add_argument("--shape", required=True, choices=sorted(SHAPES))
    s.add_argument("--quant", required=True, choices=["f32", "f16", "bf16", "q8_0", "q4_k_m"])
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--report", action="store_true", help="print the behaviour statistics of the written file")
    s.add_argument("--report-prompts", type=int, default=4)
    s.add_argument("--device", default="cpu", help="cpu or cuda (quantization and the report's forward)")
    s.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="threads that make tensors ahead of the writer (default: one per CPU); the file is the same for any number")
    s.add_argument("--max-inflight-gb", type=float, default=4.0,
                   help="fp32 gigabytes of tensors made ahead of the writer at most (default 4)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_synth)
    i = sub.add_parser("info", help="describe a qwen35 GGUF")
    i.add_argument("model")
    i.add_argument("--no-hash", action="store_true", help="skip the sha256 (slow for big files)")
    i.set_defaults(fn=cmd_info)
    g = sub.add_parser("generate", help="greedy tokens from a qwen35 GGUF")
    g.add_argument("model")
    g.add_argument("--prompt-ids")
    g.add_argument("--random-prompt", type=int, metavar="N")
    g.add_argument("--tokens", type=int, default=16)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="cpu")
    g.set_defaults(fn=cmd_generate)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
