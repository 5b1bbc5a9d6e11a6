"""Prefill at the structure of the real 0.8B model that the shared fixtures never exercise:
R = Hv/Hk = 1 (Hv == Hk), G = Hq/Hkv = 4, tied and untied LM head, several GDN chunks (64 tokens)
and several prefill chunks carried through the saved state. Random fp32 weights built in memory
(runtime.models.random_weights), compared with the fp32 reference forward."""
from pathlib import Path

import pytest
import torch

from runtime.gguf import GGMLType
from runtime.gguf.reader import GGUFModel, QTensor
from runtime.models.qwen35_reference import Qwen35Reference
from runtime.models.random_weights import random_weights, small_config
from runtime.triton.engine import load_triton_engine

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _model(cfg, weights) -> GGUFModel:
    tensors = {n: QTensor(n, GGMLType.F32, tuple(t.shape), t.numpy()) for n, t in weights.items()}
    return GGUFModel(Path("in-memory"), cfg, tensors, {}, None)


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_prefill_r1_gqa4_matches_reference_across_chunks(tied):
    cfg = small_config(n_layers=4, n_k_head=2, n_v_head=2, n_head=8, n_kv_head=2, tied_embeddings=tied)
    assert cfg.n_v_head == cfg.n_k_head and cfg.n_head // cfg.n_kv_head == 4
    model = _model(cfg, random_weights(cfg, seed=1))
    ids = torch.randint(0, cfg.vocab_size, (150,), generator=torch.Generator().manual_seed(0))
    eng = load_triton_engine(model, device=DEVICE, max_context=160)
    eng.prefill_chunk = 96  # 96 + 54 tokens: GDN chunks of 64 inside and across prefill chunks
    got = torch.cat([eng.prefill(ids[:120], all_logits=True), eng.prefill(ids[120:], all_logits=True)]).cpu()
    ref_model = Qwen35Reference.from_gguf(model)
    ref = ref_model.forward(ids, ref_model.new_state(160), all_logits=True)
    assert torch.isfinite(got).all()
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    # per 64-token block, so a wrong carried state (only the first GDN chunk right) cannot hide in a mean
    for b0 in range(0, 150, 64):
        assert kl[b0 : b0 + 64].mean().item() < 5e-3, (b0, kl[b0 : b0 + 64].mean().item())
    assert ((got - ref).norm() / ref.norm()).item() < 0.05  # bf16 GEMM operands (tied N(0,1) head: large logits)


def test_debug_probe_ignores_stale_workspace_values():
    """The per-layer probe (engine.prefill_debug) checks only what each step wrote: stale non-finite
    values from an earlier call must not be reported as 'non-finite after embedding' (on the GPU a
    failed run left every buffer NaN and the probe blamed the embedding, hiding the real layer)."""
    cfg = small_config(n_layers=4, n_k_head=2, n_v_head=2, n_head=8, n_kv_head=2)
    eng = load_triton_engine(_model(cfg, random_weights(cfg, seed=2)), device=DEVICE, max_context=16)
    eng.prefill([1, 2, 3, 4, 5, 6])
    ws = eng.prefill_workspace
    for name in ("xn", "u_raw", "u_conv", "ab", "z", "o", "y", "qg", "k", "v", "q", "attn", "act"):
        getattr(ws, name).fill_(float("nan"))
    eng.reset()
    eng.prefill_debug = True
    assert torch.isfinite(eng.prefill([1, 2, 3, 4])).all()
    # and a real non-finite value is still named, with its layer
    eng.reset()
    eng.weights.vec["blk.1.ssm_norm.weight"][0] = float("nan")
    with pytest.raises(FloatingPointError, match="layer 1 mixer"):
        eng.prefill([1, 2, 3, 4])
