"""Chunked prefill through TritonEngine on the shared tiny fixtures (Triton interpreter on CPU, CUDA
when present).

The fixture model (4 layers: 3 GDN + 1 attention, Hk=1, Hv=2 so the tiled head mapping matters)
has upstream reference logits for its F32 file; the Q4_K_M file is compared with the fp32
reference forward (runtime/models/qwen35_reference.py) on the same dequantized weights.
"""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.gguf import load_gguf
from runtime.models.qwen35_reference import Qwen35Reference
from runtime.triton.engine import load_triton_engine
from tests.paths import TINY

FIX = TINY
pytestmark = pytest.mark.skipif(not FIX.exists(), reason="shared tiny fixtures not present")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _kl_top1(logits, ref):
    lp, lq = torch.log_softmax(ref.double().cpu(), -1), torch.log_softmax(logits.double().cpu(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return kl.mean().item(), (logits.cpu().argmax(-1) == ref.cpu().argmax(-1)).float().mean().item()


@pytest.fixture(scope="module")
def prompt():
    return torch.from_numpy(np.load(FIX / "prompt_ids.npy").astype(np.int64))


@pytest.fixture(scope="module")
def f32_model():
    return load_gguf(FIX / "qwen35-tiny4-f32.gguf")


@pytest.fixture(scope="module")
def q4_model():
    return load_gguf(FIX / "qwen35-tiny4-Q4_K_M.gguf")


@pytest.fixture(scope="module")
def f32_one_pass(f32_model, prompt):
    eng = load_triton_engine(f32_model, device=DEVICE, max_context=128)
    return eng.prefill(prompt, all_logits=True).cpu()


@pytest.mark.slow
def test_f32_file_matches_upstream_logits(f32_one_pass):
    ref = torch.from_numpy(np.load(FIX / "ref_logits_hf_fp32.npy"))
    assert torch.isfinite(f32_one_pass).all()
    kl, top1 = _kl_top1(f32_one_pass, ref)
    assert kl <= 0.01 and top1 >= 0.98, (kl, top1)
    assert ((f32_one_pass - ref).norm() / ref.norm()).item() < 0.03  # bf16 GEMM operands


@pytest.mark.slow
def test_q4_matches_fp32_reference_on_dequantized_weights(q4_model, prompt):
    eng = load_triton_engine(q4_model, device=DEVICE, max_context=128)
    logits = eng.prefill(prompt, all_logits=True).cpu()
    ref_model = Qwen35Reference.from_gguf(q4_model)
    ref = ref_model.forward(prompt, ref_model.new_state(128), all_logits=True)
    kl, top1 = _kl_top1(logits, ref)
    assert kl <= 0.01 and top1 >= 0.98, (kl, top1)


@pytest.mark.slow
def test_chunked_session_reuse_then_decode_equals_one_pass(f32_model, prompt, f32_one_pass):
    """Turn 1 (24 tokens), turn 2 continued from the saved state (GDN conv + recurrent state + KV
    cache) in chunks of 16 (16 + 16 + 7), then one decode step on that state: the same logits as
    one prefill over the whole conversation (the full re-prefill). The F32 file keeps this cheap
    under the interpreter; the quantized GEMMs have their own tests."""
    eng = load_triton_engine(f32_model, device=DEVICE, max_context=128)
    turn1 = eng.prefill(prompt[:24], all_logits=True).cpu()
    eng.prefill_chunk = 16
    turn2 = eng.prefill(prompt[24:63], all_logits=True).cpu()
    step = eng.decode(int(prompt[63])).cpu()[None]
    assert eng.position == 64
    got = torch.cat([turn1, turn2, step])
    kl, top1 = _kl_top1(got, f32_one_pass)
    assert kl < 1e-3 and top1 >= 0.98, (kl, top1)
    assert ((got - f32_one_pass).norm() / f32_one_pass.norm()).item() < 1e-2


@pytest.mark.slow
def test_scratch_gemm_path_matches_tile_path(f32_model, prompt, f32_one_pass):
    """The comparison GEMM path (one matrix dequantized into a reused bf16 scratch, then torch matmul)."""
    eng = load_triton_engine(f32_model, device=DEVICE, max_context=128)
    eng.prefill_gemm = "scratch"
    logits = eng.prefill(prompt, all_logits=True).cpu()
    kl, top1 = _kl_top1(logits, f32_one_pass)
    assert kl < 1e-3 and top1 >= 0.98, (kl, top1)


def test_prefill_forward_rejects_bad_input(f32_model):
    from runtime.triton.prefill import prefill_forward

    eng = load_triton_engine(f32_model, device=DEVICE, max_context=8)
    with pytest.raises(ValueError, match="max_context"):
        prefill_forward(eng, list(range(9)))
    with pytest.raises(ValueError, match=r"\[0, 4096\)"):
        prefill_forward(eng, [1, 4096])
    with pytest.raises(ValueError, match="at least one"):
        prefill_forward(eng, [])
    with pytest.raises(ValueError, match="chunk_size"):
        prefill_forward(eng, [1, 2], chunk_size=0)


def test_random_standin_engine_types_and_prefill_contract():
    """The bench's no-file fallback: Q4_K_M tensor types per §8.4 and the prefill contract (position)."""
    from runtime.config import SHAPES
    from runtime.gguf import GGMLType
    from runtime.triton.standin import q4_k_m_type, random_engine

    cfg = SHAPES["9b"]
    assert q4_k_m_type("output.weight", cfg) == GGMLType.Q6_K
    assert q4_k_m_type("token_embd.weight", cfg) == GGMLType.Q4_K  # untied
    assert [i for i in range(32) if q4_k_m_type(f"blk.{i}.ffn_down.weight", cfg) == GGMLType.Q6_K] == [
        0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    eng = random_engine(SHAPES["tiny"], DEVICE, max_context=16)
    with pytest.raises(ValueError, match="max_context"):
        eng.prefill(list(range(17)))
    assert eng.position == 0


def test_failed_workspace_allocation_shrinks_the_chunk(monkeypatch):
    """An OOM while allocating the chunk scratch halves the chunk (never one token at a time)."""
    from runtime.config import SHAPES
    from runtime.triton import prefill as pf

    real = pf.PrefillWorkspace
    tried = []

    def fake(cfg, n, device):
        tried.append(n)
        if n > 128:
            raise torch.OutOfMemoryError("fake: no room for the chunk scratch")
        return real(cfg, n, device)

    monkeypatch.setattr(pf, "PrefillWorkspace", fake)

    class Eng:
        config, device, prefill_workspace = SHAPES["tiny"], torch.device("cpu"), None

    ws, chunk = pf._workspace(Eng, 1024)
    assert tried == [1024, 512, 256, 128] and chunk == 128 and ws.capacity == 128
    assert pf._workspace(Eng, 100) == (ws, 100)  # a smaller chunk reuses the scratch
    monkeypatch.setattr(pf, "PrefillWorkspace", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("none")))
    Eng.prefill_workspace = None
    with pytest.raises(torch.OutOfMemoryError):
        pf._workspace(Eng, 64)
