"""Behaviour statistics of a (synthetic) qwen35 GGUF: does it act like a trained model?

Printed by `tokengate-runtime synth --report`.  Targets (issue 2): final-logit std 3–6, mean
top-1 probability ≥ 0.2, argmax = current input token at ≤ 20% of positions, replacing the
token at p−8 changes the argmax at p in ≥ 10% of cases; Q8_0 vs F32 top-1 ≥ 0.99, Q4_K_M vs F32
top-1 ≥ 0.85 with mean KL ≤ 0.25.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..config import ModelConfig
from ..gguf import QTensor, load_gguf
from ..gguf.names import expected_tensors
from . import init as synth_init
from .encode import quantize_rows
from .factory import SEED_KEY, SHAPE_KEY
from ..models.qwen35_reference import Qwen35Reference
from .plan import tensor_type
from .vocab import REAL_FIRST_SPECIAL, REAL_VOCAB, SPECIAL_TOKENS

TARGETS = {
    "logit_std": (3.0, 6.0),
    "top1_prob": (0.2, None),
    "argmax_is_input": (None, 0.20),
    "offset8_sensitivity": (0.10, None),
    "q8_0_top1": (0.99, None),
    "q4_k_m_top1": (0.85, None),
    "q4_k_m_kl": (None, 0.25),
}


def n_normal_tokens(vocab_size: int) -> int:
    return REAL_FIRST_SPECIAL if vocab_size == REAL_VOCAB else vocab_size - len(SPECIAL_TOKENS)


@torch.no_grad()
def batched_logits(W: dict[str, torch.Tensor], cfg: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    """Reference fp32 logits [B, T, V] for same-length prompts ids [B, T]."""
    model = Qwen35Reference(cfg, W, device=ids.device)
    out = []
    for row in ids:
        out.append(model.forward(row, model.new_state(kv_capacity=row.shape[0]), all_logits=True))
    return torch.stack(out)


def random_prompts(vocab_size: int, n: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1_000_003 * seed + 17)
    return torch.randint(0, n_normal_tokens(vocab_size), (n, length), generator=g)


def load_fp32(path, device="cpu") -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    m = load_gguf(path)
    return m.config, {n: t.dequantize(device) for n, t in m.tensors.items()}, m.metadata


def sibling_fp32(cfg: ModelConfig, seed: int, quant: str, device="cpu") -> dict[str, torch.Tensor]:
    """The same synthetic weights as `synth` writes for `quant`, dequantized, without a file."""
    from ..quant import dequantize

    out = {}
    for name, shape in expected_tensors(cfg).items():
        ttype = tensor_type(name, shape, cfg, quant)
        full = torch.cat([c.reshape(-1, shape[-1]) if len(shape) > 1 else c for c in synth_init.generate(name, shape, cfg, seed)])
        raw = quantize_rows(full.float(), ttype, device)
        out[name] = dequantize(QTensor(name, ttype, shape, np.asarray(raw)), device=device).reshape(shape)
    return out


def behaviour(W, cfg: ModelConfig, ids: torch.Tensor, offset: int = 8, n_sens: int = 8, seed: int = 0) -> tuple[dict, torch.Tensor]:
    lg = batched_logits(W, cfg, ids)
    prob = lg.softmax(-1)
    am = lg.argmax(-1)
    r = {
        "logit_std": lg.std(-1).mean().item(),
        "top1_prob": prob.max(-1).values.mean().item(),
        "argmax_is_input": (am == ids).float().mean().item(),
        "argmax_is_previous": (am[:, 1:] == ids[:, :-1]).float().mean().item(),
        "argmax_is_successor": (am == synth_init.successor(ids, synth_init.DEFAULT.orbit)).float().mean().item(),
    }
    # Sensitivity: one variant per (prompt, position) with only token p-offset replaced.
    B, T = ids.shape
    g = torch.Generator().manual_seed(seed + 99)
    pos = torch.linspace(max(offset, T // 2), T - 1, n_sens).round().long().unique()
    variants, where = [], []
    for b in range(B):
        for p in pos.tolist():
            v = ids[b, : p + 1].clone()
            new = int(torch.randint(0, n_normal_tokens(cfg.vocab_size) - 1, (1,), generator=g))
            v[p - offset] = new + (new >= v[p - offset])  # always a different token
            variants.append(v)
            where.append((b, p))
    changed = 0
    for p in pos.tolist():  # batch the variants of equal length
        idx = [k for k, (_, q) in enumerate(where) if q == p]
        lv = batched_logits(W, cfg, torch.stack([variants[k] for k in idx]).to(ids.device))[:, -1]
        changed += int((lv.argmax(-1) != am[[where[k][0] for k in idx], p]).sum())
    r["offset8_sensitivity"] = changed / len(variants)
    return r, lg


def compare(ref: torch.Tensor, other: torch.Tensor) -> dict:
    lp, lq = ref.log_softmax(-1), other.log_softmax(-1)
    return {
        "top1": (ref.argmax(-1) == other.argmax(-1)).float().mean().item(),
        "kl_mean": (lp.exp() * (lp - lq)).sum(-1).mean().item(),
    }


def report(path, device="cpu", n_prompts: int = 4, length: int = 128, seed: int = 0, compare_quants: bool = True) -> dict:
    path = Path(path)
    cfg, W, meta = load_fp32(path, device)
    ids = random_prompts(cfg.vocab_size, n_prompts, length, seed).to(device)
    r, lg = behaviour(W, cfg, ids, seed=seed)
    out = {"file": str(path), "shape": meta.get(SHAPE_KEY), "prompts": f"{n_prompts}x{length}", **r}
    file_type = meta.get("general.file_type")
    del W
    for q, key in (("q8_0", "q8_0"), ("q4_k_m", "q4_k_m")):
        out[f"{key}_top1"] = out[f"{key}_kl"] = None
        out[f"{key}_why_null"] = None
        if not compare_quants:
            out[f"{key}_why_null"] = "comparison not requested"
            continue
        if meta.get(SHAPE_KEY) is None:
            out[f"{key}_why_null"] = "not a tokengate synthetic file (no provenance keys)"
            continue
        from ..config import shape as named_shape

        scfg, sseed = named_shape(str(meta[SHAPE_KEY])), int(meta[SEED_KEY])
        try:
            ref = lg if file_type == 0 else batched_logits(sibling_fp32(scfg, sseed, "f32", device), scfg, ids)
            other = batched_logits(sibling_fp32(scfg, sseed, q, device), scfg, ids)
        except RuntimeError as e:  # e.g. no K-quant quantizer available
            out[f"{key}_why_null"] = str(e)
            continue
        c = compare(ref, other)
        out[f"{key}_top1"], out[f"{key}_kl"] = c["top1"], c["kl_mean"]
    out["meets_targets"] = {k: _meets(out.get(k), lo, hi) for k, (lo, hi) in TARGETS.items()}
    return out


def _meets(v, lo, hi):
    if v is None:
        return None
    return (lo is None or v >= lo) and (hi is None or v <= hi)


def print_report(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"synthetic model behaviour — {r['file']} ({r['prompts']} random prompt tokens)")
    t.add_column("statistic")
    t.add_column("value", justify="right")
    t.add_column("target")
    t.add_column("ok")
    for k in ("logit_std", "top1_prob", "argmax_is_input", "argmax_is_previous", "argmax_is_successor",
              "offset8_sensitivity", "q8_0_top1", "q8_0_kl", "q4_k_m_top1", "q4_k_m_kl"):
        v = r.get(k)
        lo, hi = TARGETS.get(k, (None, None))
        target = "" if k not in TARGETS else (f"{lo}–{hi}" if lo is not None and hi is not None else (f"≥ {lo}" if lo is not None else f"≤ {hi}"))
        ok = r["meets_targets"].get(k)
        shown = "null: " + str(r.get(k.rsplit("_", 1)[0] + "_why_null") or r.get(k[:-4] + "_why_null")) if v is None else f"{v:.3f}"
        t.add_row(k, shown, target, "" if ok is None else ("yes" if ok else "NO"))
    Console().print(t)
