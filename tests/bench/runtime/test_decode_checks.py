"""bench/runtime/decode.py's kernel checks on the shared tiny Q4_K_M fixture (CPU interpreter in CI): the
GEMVs are checked with the heuristic tiles and with the engine's own, int8-x ones included."""
import os
from pathlib import Path

import pytest
import torch
from tests.paths import TINY

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

FIX = TINY / "qwen35-tiny4-Q4_K_M.gguf"


@pytest.mark.slow
@pytest.mark.skipif(not FIX.exists(), reason="shared tiny fixtures not present")
def test_kernel_checks_cover_the_engines_own_gemv_tiles():
    from bench.runtime.decode import kernel_checks
    from runtime.gguf import load_gguf
    from runtime.kernels.gemv import AutoTile
    from runtime.triton.engine import TritonEngine

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    eng = TritonEngine(load_gguf(FIX), dev, 64, use_graph=False, gemv_config=AutoTile(2, x8=True))
    out = kernel_checks(eng, attn_ctx=16)
    mine = {k: v for k, v in out.items() if k.endswith("(engine tiles)")}
    assert {"gemv gate/up swiglu (engine tiles)", "gemv gdn in-proj 4 segments + conv (engine tiles)"} <= set(mine)
    assert any(k.startswith("gemv Q4_K") for k in mine) and any(k.startswith("gemv Q6_K") for k in mine)
    heuristic = {k: v for k, v in out.items() if k.startswith("gemv") and k not in mine}
    assert max(heuristic.values()) < 1e-4, heuristic  # fp32 x: summation order only
    swiglu = mine["gemv gate/up swiglu (engine tiles)"]
    assert 1e-5 < swiglu < 3e-2, mine  # int8 x: the rounding of x shows, and stays small



@pytest.mark.skipif(not FIX.exists(), reason="shared tiny fixtures not present")
def test_the_reference_made_on_use_reads_every_tensor_the_engine_holds():
    """The 27B's reference check makes its fp32 weights on use (they would not fit beside the engine): every
    tensor the reference reads is one the engine holds, of its size, and made from it (the small ones compared
    whole: dequantizing the large ones under the interpreter takes minutes)."""
    import math

    from bench.runtime.decode import dequantized_one, reference_weights
    from runtime.gguf import load_gguf
    from runtime.models.qwen35_reference import WeightsOnUse
    from runtime.triton.engine import TritonEngine

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    eng = TritonEngine(load_gguf(FIX), dev, 64, use_graph=False)
    lazy = reference_weights(eng, on_use=True)
    assert isinstance(lazy, WeightsOnUse)
    held = {k: m.rows * m.cols for k, m in eng.weights.mat.items()} | {k: v.numel() for k, v in eng.weights.vec.items()}
    assert {k: math.prod(s) for k, s in lazy.shapes.items()} == {k: held[k] for k in lazy.shapes}
    small = [k for k in lazy if math.prod(lazy.shapes[k]) <= 4096][:12]
    assert any(k.endswith("ssm_conv1d.weight") for k in small)  # [C, 4] from the engine's own layout
    for name in small:
        assert torch.equal(lazy[name], dequantized_one(eng, name).reshape(lazy.shapes[name])), name
