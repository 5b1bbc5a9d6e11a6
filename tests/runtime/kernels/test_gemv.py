import pytest
import torch

from runtime.gguf import GGMLType
from runtime.kernels.gemv import GemvConfig, gemv, gemv_naive
from runtime.triton.weights import random_qweight

ALL_TYPES = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.F32, GGMLType.F16, GGMLType.BF16]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _nan(n, device):
    return torch.full((n,), float("nan"), device=device)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_gemv_single_matrix_with_norm(device, qtype):
    seed = int(torch.randint(0, 2**31, ()).item())  # fresh every run
    rows, cols = 37, 512  # rows not a multiple of the tile: exercises the clamped tail
    w = random_qweight(qtype, rows, cols, device, seed=seed)
    x = torch.randn(cols, device=device)
    nw = torch.rand(cols, device=device) + 0.5
    out = gemv(x, [w], _nan(rows, device), norm_weight=nw)
    ref = gemv_naive(x, [w], norm_weight=nw)
    assert torch.isfinite(out).all()
    assert _rel(out, ref) < 2e-5, f"seed {seed}"
    out2 = gemv(x, [w], _nan(rows, device))  # without the fused norm
    assert _rel(out2, gemv_naive(x, [w])) < 2e-5


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q5_K], ids=lambda t: t.name)
def test_gemv_tile_variants_agree(device, qtype):
    w = random_qweight(qtype, 24, 1024, device, seed=int(torch.randint(0, 2**31, ()).item()))
    x = torch.randn(1024, device=device)
    ref = gemv_naive(x, [w])
    for cfg in (GemvConfig(1, 4, 1), GemvConfig(4, 2, 4, acc=1), GemvConfig(8, 4, 4), GemvConfig(16, 1, 2, acc=1),
                GemvConfig(2, 8, 4, acc=1)):
        assert _rel(gemv(x, [w], _nan(24, device), config=cfg), ref) < 2e-5, cfg


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
    out = gemv(x, ws, _nan(74, device), norm_weight=nw, conv_state=cst, conv_weight=cw)
    ref = gemv_naive(x, ws, norm_weight=nw, conv_state=cst_ref, conv_weight=cw)
    assert _rel(out, ref) < 2e-5, f"seed {seed}"
    for lo, hi in ((0, 48), (48, 68), (68, 71), (71, 74)):
        assert _rel(out[lo:hi], ref[lo:hi]) < 2e-5, (lo, hi)
    assert _rel(cst, cst_ref) < 1e-5  # state shifted, raw projection appended


def test_gemv_swiglu_and_residual(device):
    seed = int(torch.randint(0, 2**31, ()).item())
    g = random_qweight(GGMLType.Q4_K, 40, 512, device, seed, "gate")
    u = random_qweight(GGMLType.Q5_K, 40, 512, device, seed + 1, "up")
    x = torch.randn(512, device=device)
    nw = torch.rand(512, device=device) + 0.5
    out = gemv(x, [g, u], _nan(40, device), norm_weight=nw, swiglu=True)
    assert _rel(out, gemv_naive(x, [g, u], norm_weight=nw, swiglu=True)) < 2e-5
    d = random_qweight(GGMLType.Q6_K, 16, 512, device, seed + 2, "down")
    h = torch.randn(16, device=device)
    ref = gemv_naive(x, [d], residual=h)
    gemv(x, [d], h, residual=h)  # in place: out aliases the residual
    assert _rel(h, ref) < 2e-5


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
        out = gemv(x, [w], _nan(10, device), norm_weight=nw, config=cfg)
        assert _rel(out, ref) < 2e-5, (cfg, seed)
    h = torch.randn(10, device=device)
    ref = gemv_naive(x, [w], residual=h)
    gemv(x, [w], h, residual=h, config=GemvConfig(2, 4, 4))
    assert _rel(h, ref) < 2e-5


@pytest.mark.parametrize("q6,acc", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_gemv_q6_k_unpackings(device, q6, acc):
    seed = int(torch.randint(0, 2**31, ()).item())
    K = 768  # 3 super-blocks: BB=2 and BB=4 steps are masked
    w = random_qweight(GGMLType.Q6_K, 12, K, device, seed=seed)
    x = torch.randn(K, device=device)
    nw = torch.rand(K, device=device) + 0.5
    ref = gemv_naive(x, [w], norm_weight=nw)
    for bn, bb in ((4, 1), (2, 2), (8, 4)):
        out = gemv(x, [w], _nan(12, device), norm_weight=nw, config=GemvConfig(bn, bb, 4, q6, acc=acc))
        assert _rel(out, ref) < 2e-5, (bn, bb, seed)
