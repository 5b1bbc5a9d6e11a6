import pytest
import torch

from runtime.gguf import GGMLType
from runtime.kernels.gemv import GemvConfig, gemv, gemv_naive
from runtime.triton.weights import random_qweight
from tests.runtime.kernels.gemv.gemv_helpers import nan_vector, rel

ALL_TYPES = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.F32, GGMLType.F16, GGMLType.BF16]


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_gemv_single_matrix_with_norm(device, qtype):
    seed = int(torch.randint(0, 2**31, ()).item())  # fresh every run
    rows, cols = 37, 512  # rows not a multiple of the tile: exercises the clamped tail
    w = random_qweight(qtype, rows, cols, device, seed=seed)
    x = torch.randn(cols, device=device)
    nw = torch.rand(cols, device=device) + 0.5
    out = gemv(x, [w], nan_vector(rows, device), norm_weight=nw)
    ref = gemv_naive(x, [w], norm_weight=nw)
    assert torch.isfinite(out).all()
    assert rel(out, ref) < 2e-5, f"seed {seed}"
    out2 = gemv(x, [w], nan_vector(rows, device))  # without the fused norm
    assert rel(out2, gemv_naive(x, [w])) < 2e-5


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q5_K], ids=lambda t: t.name)
def test_gemv_tile_variants_agree(device, qtype):
    w = random_qweight(qtype, 24, 1024, device, seed=int(torch.randint(0, 2**31, ()).item()))
    x = torch.randn(1024, device=device)
    ref = gemv_naive(x, [w])
    for cfg in (GemvConfig(1, 4, 1), GemvConfig(4, 2, 4, acc=1), GemvConfig(8, 4, 4), GemvConfig(16, 1, 2, acc=1),
                GemvConfig(2, 8, 4, acc=1)):
        assert rel(gemv(x, [w], nan_vector(24, device), config=cfg), ref) < 2e-5, cfg


def test_gemv_four_segments_mixed_types_and_conv(device):
    seed = int(torch.randint(0, 2**31, ()).item())
    K = 256
    ws = [random_qweight(GGMLType.Q6_K, 48, K, device, seed, "qkv"), random_qweight(GGMLType.Q4_K, 20, K, device, seed + 1, "z"),
          random_qweight(GGMLType.Q8_0, 3, K, device, seed + 2, "b"), random_qweight(GGMLType.F32, 3, K, device, seed + 3, "a")]
    x = torch.randn(K, device=device)
    nw = torch.rand(K, device=device) + 0.5
    cst = torch.randn(3, 48, device=device)
    cw = torch.randn(48, 4, device=device)
    cst_ref = cst.clone()
    out = gemv(x, ws, nan_vector(74, device), norm_weight=nw, conv_state=cst, conv_weight=cw)
    ref = gemv_naive(x, ws, norm_weight=nw, conv_state=cst_ref, conv_weight=cw)
    assert rel(out, ref) < 2e-5, f"seed {seed}"
    for lo, hi in ((0, 48), (48, 68), (68, 71), (71, 74)):
        assert rel(out[lo:hi], ref[lo:hi]) < 2e-5, (lo, hi)
    assert rel(cst, cst_ref) < 1e-5  # state shifted, raw projection appended


def test_gemv_swiglu_and_residual(device):
    seed = int(torch.randint(0, 2**31, ()).item())
    g = random_qweight(GGMLType.Q4_K, 40, 512, device, seed, "gate")
    u = random_qweight(GGMLType.Q5_K, 40, 512, device, seed + 1, "up")
    x = torch.randn(512, device=device)
    nw = torch.rand(512, device=device) + 0.5
    out = gemv(x, [g, u], nan_vector(40, device), norm_weight=nw, swiglu=True)
    assert rel(out, gemv_naive(x, [g, u], norm_weight=nw, swiglu=True)) < 2e-5
    d = random_qweight(GGMLType.Q6_K, 16, 512, device, seed + 2, "down")
    h = torch.randn(16, device=device)
    ref = gemv_naive(x, [d], residual=h)
    gemv(x, [d], h, residual=h)  # in place: out aliases the residual
    assert rel(h, ref) < 2e-5


def test_gemv_rejects_bad_shapes(device):
    w = random_qweight(GGMLType.Q4_K, 8, 256, device)
    with pytest.raises(ValueError, match="256"):
        gemv(torch.randn(512, device=device), [w])
    with pytest.raises(ValueError, match="input size"):
        gemv(torch.randn(256, device=device), [w, random_qweight(GGMLType.Q4_K, 8, 512, device)])


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0], ids=lambda t: t.name)
def test_gemv_k_step_not_dividing_the_blocks(device, qtype):
    """BB larger than / not dividing the block count (3 super-blocks): the last step is masked."""
    seed = int(torch.randint(0, 2**31, ()).item())
    K = 768
    w = random_qweight(qtype, 10, K, device, seed=seed)
    x = torch.randn(K, device=device)
    nw = torch.rand(K, device=device) + 0.5
    ref = gemv_naive(x, [w], norm_weight=nw)
    for cfg in (GemvConfig(2, 2, 4), GemvConfig(4, 16, 4)):
        out = gemv(x, [w], nan_vector(10, device), norm_weight=nw, config=cfg)
        assert rel(out, ref) < 2e-5, (cfg, seed)
    h = torch.randn(10, device=device)
    ref = gemv_naive(x, [w], residual=h)
    gemv(x, [w], h, residual=h, config=GemvConfig(2, 4, 4))
    assert rel(h, ref) < 2e-5


@pytest.mark.parametrize("q6,acc", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_gemv_q6_k_unpackings(device, q6, acc):
    seed = int(torch.randint(0, 2**31, ()).item())
    K = 768  # 3 super-blocks: BB=2 and BB=4 steps are masked
    w = random_qweight(GGMLType.Q6_K, 12, K, device, seed=seed)
    x = torch.randn(K, device=device)
    nw = torch.rand(K, device=device) + 0.5
    ref = gemv_naive(x, [w], norm_weight=nw)
    for bn, bb in ((4, 1), (2, 2), (8, 4)):
        out = gemv(x, [w], nan_vector(12, device), norm_weight=nw, config=GemvConfig(bn, bb, 4, q6, acc=acc))
        assert rel(out, ref) < 2e-5, (bn, bb, seed)


def test_gemv_pipelining_and_wide_tiles(device):
    """The bench's GEMV variants: num_stages 1/4 and 8-warp tiles of many rows give the same result."""
    seed = int(torch.randint(0, 2**31, ()).item())
    K = 512
    ws = [random_qweight(GGMLType.Q4_K, 40, K, device, seed), random_qweight(GGMLType.Q6_K, 24, K, device, seed + 1)]
    x = torch.randn(K, device=device)
    ref = gemv_naive(x, ws)
    for cfg in (GemvConfig(8, 2, 4, num_stages=1), GemvConfig(16, 2, 8, num_stages=4), GemvConfig(16, 1, 8)):
        out = gemv(x, ws, nan_vector(64, device), config=cfg)
        assert rel(out, ref) < 2e-5, (cfg, seed)


def test_autotile_overrides_scale_the_heuristic_tile():
    from runtime.kernels.gemv.kernel import AutoTile, auto_config_v2, resolve_config, set_sm_count

    meta = torch.device("meta")
    set_sm_count(meta, 132)
    w = random_qweight(GGMLType.Q4_K, 8, 2560, "cpu", 0)
    big = type(w)(w.name, w.qtype, 9216, w.cols, torch.empty(9216, w.row_bytes, dtype=torch.uint8, device=meta))
    base = auto_config_v2([big], meta)
    got = resolve_config(AutoTile(2, bn_scale=2, num_warps=8, num_stages=1), [big], meta)
    assert (got.block_n, got.block_b, got.num_warps, got.num_stages) == (2 * base.block_n, base.block_b, 8, 1)
    assert resolve_config(AutoTile(2), [big], meta) == base
    assert resolve_config(AutoTile(2, bn_scale=2), [w], "cpu").block_n == 512  # interpreter tile on CPU
