"""Chunked prefill end to end on the shared tiny fixtures (Triton interpreter on CPU, CUDA when present).

The fixture model (4 layers: 3 GDN + 1 attention, Hk=1, Hv=2 so the tiled head mapping
matters) has reference logits from the upstream implementation for its F32 file.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from runtime.gguf import load_gguf  # noqa: E402
from runtime.triton.standin import StandInEngine  # noqa: E402

from fp32_reference import Fp32Reference  # noqa: E402

FIX = Path("/work/shared/fixtures/qwen35-tiny")
if not FIX.exists():
    FIX = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "qwen35-tiny"
if not FIX.exists():
    pytest.skip("shared tiny fixtures not found", allow_module_level=True)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _kl_top1(logits, ref):
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(logits.double().cpu(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return kl.mean().item(), (logits.cpu().argmax(-1) == ref.argmax(-1)).float().mean().item()


@pytest.fixture(scope="module")
def q4():
    return load_gguf(FIX / "qwen35-tiny4-Q4_K_M.gguf")


@pytest.fixture(scope="module")
def prompt():
    return torch.from_numpy(np.load(FIX / "prompt_ids.npy").astype(np.int64))


@pytest.fixture(scope="module")
def f32_path():
    return FIX / "qwen35-tiny4-f32.gguf"


@pytest.fixture(scope="module")
def f32_one_pass(f32_path, prompt):
    return StandInEngine(f32_path, DEVICE, max_context=128).prefill(prompt, all_logits=True).cpu()


@pytest.fixture(scope="module")
def q4_one_pass(q4, prompt):
    eng = StandInEngine(q4, DEVICE, max_context=256)
    return eng.prefill(prompt, all_logits=True).cpu()


@pytest.mark.slow
def test_f32_file_matches_upstream_logits(f32_one_pass):
    logits = f32_one_pass
    ref = torch.from_numpy(np.load(FIX / "ref_logits_hf_fp32.npy"))
    assert torch.isfinite(logits).all()
    kl, top1 = _kl_top1(logits, ref)
    assert kl <= 0.01 and top1 >= 0.98, (kl, top1)
    assert ((logits - ref).norm() / ref.norm()).item() < 0.03  # bf16 GEMM operands


@pytest.mark.slow
def test_q4_matches_fp32_reference_on_dequantized_weights(q4, prompt, q4_one_pass):
    ref = Fp32Reference(q4).forward(prompt)
    kl, top1 = _kl_top1(q4_one_pass, ref)
    assert kl <= 0.01 and top1 >= 0.98, (kl, top1)


def test_fp32_reference_token_by_token_equals_one_pass(q4, prompt):
    """The reference's own consistency: one pass == a token-by-token decode (fp32 tolerance)."""
    whole = Fp32Reference(q4).forward(prompt[:12])
    ref = Fp32Reference(q4)
    steps = torch.cat([ref.forward(prompt[i : i + 1]) for i in range(12)])
    torch.testing.assert_close(steps, whole, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_chunked_session_reuse_equals_one_pass(f32_path, prompt, f32_one_pass):
    """Turn 1 (24 tokens), turn 2 continued from the saved state (GDN conv + recurrent state + KV
    cache) in chunks of 16 (16 + 16 + 7), then a single-token step: the same logits as one
    prefill over the whole conversation (the full re-prefill). The F32 file keeps this cheap under
    the interpreter; the quantized GEMMs have their own tests."""
    eng = StandInEngine(f32_path, DEVICE, max_context=256)
    turn1 = eng.prefill(prompt[:24], all_logits=True).cpu()
    turn2 = eng.prefill(prompt[24:63], all_logits=True, chunk_size=16).cpu()
    step = eng.prefill(prompt[63:64]).cpu()[None]
    assert eng.position == 64
    got = torch.cat([turn1, turn2, step])
    kl, top1 = _kl_top1(got, f32_one_pass)
    assert kl < 1e-3 and top1 >= 0.98, (kl, top1)
    assert ((got - f32_one_pass).norm() / f32_one_pass.norm()).item() < 1e-2


@pytest.mark.slow
def test_scratch_gemm_path_matches_tile_path(f32_path, prompt, f32_one_pass):
    """The comparison GEMM path (one matrix dequantized into a reused bf16 scratch, then torch matmul)."""
    eng = StandInEngine(f32_path, DEVICE, max_context=128)
    eng.prefill_gemm = "scratch"
    logits = eng.prefill(prompt, all_logits=True).cpu()
    kl, top1 = _kl_top1(logits, f32_one_pass)
    assert kl < 1e-3 and top1 >= 0.98, (kl, top1)


def test_prefill_rejects_bad_input(q4):
    eng = StandInEngine(q4, DEVICE, max_context=8)
    with pytest.raises(ValueError, match="max_context"):
        eng.prefill(list(range(9)))
    with pytest.raises(ValueError, match=r"\[0, 4096\)"):
        eng.prefill([1, 4096])
    with pytest.raises(ValueError, match="at least one"):
        eng.prefill([])
