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
