"""The GEMV's words path (runtime/kernels/gemv/words.py) against the fp64 dequantized reference,
and the measured tile table the engine uses on sm_90."""
from dataclasses import replace

import pytest
import torch

from runtime.gguf import GGMLType
from runtime.kernels.gemv import GemvConfig, TileTable, gemv, gemv_naive, tile_key
from runtime.kernels.gemv.kernel import resolve_config, words_fit
from runtime.kernels.gemv.tiles import sm90_table
from runtime.triton.weights import random_qweight
from tests.runtime.kernels.gemv.gemv_helpers import fresh_seed, nan_vector, rel


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("cols", [512, 1536])  # 2 and 6 blocks: one and three Q6_K block pairs
def test_words_path_matches_reference(device, qtype, cols):
    seed = fresh_seed()
    w = random_qweight(qtype, 37, cols, device, seed=seed)
    assert words_fit(w, 2)
    x = torch.randn(cols, device=device)
    nw = torch.rand(cols, device=device) + 0.5
    for cfg in (GemvConfig(4, 2, 4, words=True), GemvConfig(16, 2, 2, words=True)):
        out = gemv(x, [w], nan_vector(37, device), norm_weight=nw, config=cfg)
        assert torch.isfinite(out).all()
        assert rel(out, gemv_naive(x, [w], norm_weight=nw)) < 2e-5, (cfg, seed)
        assert rel(gemv(x, [w], nan_vector(37, device), config=cfg), gemv_naive(x, [w])) < 2e-5, (cfg, seed)


def test_words_path_in_fused_launches(device):
    """Four segments with the conv epilogue (Q6_K + Q4_K words, Q8_0/F32 byte-wise in the same
    launch), SwiGLU, and the residual epilogue."""
    seed, K = fresh_seed(), 512
    ws = [random_qweight(GGMLType.Q6_K, 48, K, device, seed, "qkv"), random_qweight(GGMLType.Q4_K, 20, K, device, seed + 1, "z"),
          random_qweight(GGMLType.Q8_0, 3, K, device, seed + 2, "b"), random_qweight(GGMLType.F32, 3, K, device, seed + 3, "a")]
    cfg = GemvConfig(8, 2, 4, words=True)
    x, nw = torch.randn(K, device=device), torch.rand(K, device=device) + 0.5
    cst, cw = torch.randn(3, 48, device=device), torch.randn(48, 4, device=device)
    cst_ref = cst.clone()
    out = gemv(x, ws, nan_vector(74, device), norm_weight=nw, conv_state=cst, conv_weight=cw, config=cfg)
    ref = gemv_naive(x, ws, norm_weight=nw, conv_state=cst_ref, conv_weight=cw)
    assert rel(out, ref) < 2e-5, seed
    assert rel(cst, cst_ref) < 1e-5
    g, u = (random_qweight(GGMLType.Q4_K, 40, K, device, seed + i, n) for i, n in ((4, "gate"), (5, "up")))
    assert rel(gemv(x, [g, u], nan_vector(40, device), norm_weight=nw, swiglu=True, config=cfg),
                gemv_naive(x, [g, u], norm_weight=nw, swiglu=True)) < 2e-5, seed
    d = random_qweight(GGMLType.Q6_K, 16, K, device, seed + 6, "down")
    h = torch.randn(16, device=device)
    ref = gemv_naive(x, [d], residual=h)
    gemv(x, [d], h, residual=h, config=cfg)
    assert rel(h, ref) < 2e-5, seed


def test_words_path_falls_back_where_it_cannot_read_words(device):
    """One Q6_K block per row (no pair) or a step that does not divide the blocks: the byte-wise
    path runs instead, and the result is still right."""
    odd = random_qweight(GGMLType.Q6_K, 9, 256, device, seed=fresh_seed())
    assert not words_fit(odd, 2)
    q4 = random_qweight(GGMLType.Q4_K, 9, 768, device, seed=fresh_seed())  # 3 blocks
    assert not words_fit(q4, 2) and words_fit(q4, 1)
    for w in (odd, q4):
        x = torch.randn(w.cols, device=device)
        assert rel(gemv(x, [w], nan_vector(9, device), config=GemvConfig(4, 2, 4, words=True)), gemv_naive(x, [w])) < 2e-5


def test_tile_table_lookup_and_fallback():
    a = random_qweight(GGMLType.Q4_K, 8, 512, "cpu")
    b = random_qweight(GGMLType.Q6_K, 8, 512, "cpu")
    cfg = GemvConfig(16, 2, 2, words=True)
    table = TileTable.from_dict({tile_key([a]): {"block_n": 16, "block_b": 2, "num_warps": 2, "words": True}})
    assert table.lookup([a]) == cfg
    assert table.lookup([b]) == table.fallback
    assert table.lookup([a, a], swiglu=True) == table.fallback  # the SwiGLU pair is its own launch shape
    assert resolve_config(table, [a], "meta") == cfg  # any GPU-side device uses the table


def test_sm90_table_entries_fit_their_shapes():
    """Every measured tile is a real words/bytes config for the shape it is keyed by."""
    table = sm90_table()
    assert table.entries
    for key, cfg in table.entries:
        mats = key.removesuffix(":swiglu").split("+")
        for m in mats:
            qtype, shape = m.split(":")
            rows, cols = map(int, shape.split("x"))
            w = random_qweight(GGMLType[qtype], 1, cols, "meta")
            assert cfg.block_b >= 1 and cfg.block_n >= 1 and cfg.num_warps in (1, 2, 4, 8)
            if cfg.words:
                assert words_fit(w, cfg.block_b), key


def test_tile_table_replaced_changes_the_chosen_entries_only():
    t = sm90_table()
    x8 = t.replaced(x8=True)
    assert all(c.x8 for _, c in x8.entries) and x8.fallback.x8
    only = t.replaced(only="swiglu", x8=True)
    before = dict(t.entries)
    assert all(c == (replace(before[k], x8=True) if "swiglu" in k else before[k]) for k, c in only.entries)
    assert only.fallback == t.fallback
