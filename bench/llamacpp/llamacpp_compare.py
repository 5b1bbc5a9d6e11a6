"""Compare llama.cpp's logits with our fp32 reference on the same GGUF and prompt.

llama.cpp is built from source on the GPU box in an ignored folder (never committed); a small
program there writes its fp32 logits for every prompt position to a raw file. This script makes
the prompt, runs our reference on the same file and prints one JSON record:

    python3 bench/llamacpp/llamacpp_compare.py prompt  --vocab V --n 128 --seed 0 -o ids.i32
    python3 bench/llamacpp/llamacpp_compare.py compare model.gguf ids.i32 llama_logits.f32 [-o result.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runtime.gguf.writer import file_sha256 as sha256  # noqa: E402
from runtime.models.qwen35_reference import Qwen35Reference  # noqa: E402


def compare_logits(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    """Relative error, top-1 agreement and KL(ours || theirs) over all positions."""
    ours, theirs = ours.double(), theirs.double()
    rel = float((ours - theirs).norm() / ours.norm())
    top1 = float((ours.argmax(-1) == theirs.argmax(-1)).double().mean())
    lp, lq = torch.log_softmax(ours, -1), torch.log_softmax(theirs, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return {"rel_err": rel, "top1_agree": top1, "kl_mean": float(kl.mean()), "kl_max": float(kl.max())}


def cmd_prompt(args) -> int:
    gen = np.random.default_rng(args.seed)
    ids = gen.integers(0, args.vocab, size=args.n, dtype=np.int32)
    ids.tofile(args.output)
    return 0


def cmd_compare(args) -> int:
    ids = np.fromfile(args.ids, dtype=np.int32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Qwen35Reference.from_gguf(args.gguf, device=device)
    vocab = model.cfg.vocab_size
    theirs = torch.from_numpy(np.fromfile(args.logits, dtype=np.float32).reshape(len(ids), vocab))
    state = model.new_state(len(ids))
    with torch.no_grad():
        ours = model.forward(torch.tensor(ids, dtype=torch.long, device=device), state, all_logits=True).float().cpu()
    record = {
        "gguf": str(args.gguf),
        "gguf_sha256": sha256(Path(args.gguf)),
        "positions": len(ids),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "ours_logit_std": float(ours.std(-1).mean()),
        **compare_logits(ours, theirs),
    }
    text = json.dumps(record)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompt")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", required=True)
    c = sub.add_parser("compare")
    c.add_argument("gguf")
    c.add_argument("ids")
    c.add_argument("logits")
    c.add_argument("-o", "--output")
    args = ap.parse_args()
    return cmd_prompt(args) if args.cmd == "prompt" else cmd_compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
