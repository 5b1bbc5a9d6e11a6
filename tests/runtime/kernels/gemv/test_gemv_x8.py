"""The GEMV's int8-x path (GemvConfig.x8, runtime/kernels/gemv/q8dot.py): Q4_K rows times the
dequantized int8 blocks of x, to fp32 summation error; other types in the launch keep fp32 x."""
import pytest
import torch
import torch.nn.functional as F

from runtime.gguf import GGMLType
from runtime.kernels.gemv import GemvConfig, gemv, gemv_naive
from runtime.kernels.gemv.kernel import x8_applies, x8_paths
from runtime.kernels.quant_x import Q8Vector, dequantize_q8
from runtime.triton.weights import random_qweight
from tests.runtime.kernels.gemv.gemv_helpers import fresh_seed, nan_vector, rel

CONFIGS = [GemvConfig(4, 2, 4, x8=True), GemvConfig(16, 2, 2, words=True, x8=True), GemvConfig(8, 1, 4, x8=True)]


@pytest.mark.parametrize("cols", [512, 1024])
def test_x8_equals_the_dequantized_int8_x(device, cols):
    seed = fresh_seed()
    w = random_qweight(GGMLType.Q4_K, 37, cols, device, seed=seed)
    x, nw = torch.randn(cols, device=device), torch.rand(cols, device=device) + 0.5
    for cfg in CONFIGS:
        assert x8_applies(cfg, [w])
        q8 = Q8Vector.empty(cols, device)
        out = gemv(x, [w], nan_vector(37, device), norm_weight=nw, config=cfg, q8=q8)
        exact = gemv_naive(dequantize_q8(q8, cols), [w]) * q8.rstd  # what the int8 blocks stand for
        assert rel(out, exact) < 2e-6, (cfg, seed)
        assert rel(out, gemv_naive(x, [w], norm_weight=nw)) < 2e-2, (cfg, seed)  # rounding x to int8
        out = gemv(x, [w], nan_vector(37, device), config=cfg, q8=q8)  # no norm: rstd = 1
        assert rel(out, gemv_naive(dequantize_q8(q8, cols), [w])) < 2e-6, (cfg, seed)


def test_x8_in_fused_launches(device):
    """Q6_K (conv epilogue) + Q4_K + Q8_0 + F32 in one launch: only the Q4_K rows see int8 x;
    SwiGLU and the residual epilogue on the int8 path."""
    seed, K = fresh_seed(), 512
    ws = [random_qweight(GGMLType.Q6_K, 48, K, device, seed, "qkv"), random_qweight(GGMLType.Q4_K, 20, K, device, seed + 1, "z"),
          random_qweight(GGMLType.Q8_0, 3, K, device, seed + 2, "b"), random_qweight(GGMLType.F32, 3, K, device, seed + 3, "a")]
    cfg = GemvConfig(8, 2, 4, words=True, x8=True)
    x, nw = torch.randn(K, device=device), torch.rand(K, device=device) + 0.5
    cst, cw = torch.randn(3, 48, device=device), torch.randn(48, 4, device=device)
    cst_ref = cst.clone()
    q8 = Q8Vector.empty(K, device)
    out = gemv(x, ws, nan_vector(74, device), norm_weight=nw, conv_state=cst, conv_weight=cw, config=cfg, q8=q8)
    ref = gemv_naive(x, ws, norm_weight=nw, conv_state=cst_ref, conv_weight=cw)
    xq = dequantize_q8(q8, K)
    assert rel(out[:48], ref[:48]) < 2e-5 and rel(out[68:], ref[68:]) < 2e-5, seed  # fp32 x segments
    assert rel(out[48:68], gemv_naive(xq, [ws[1]]) * q8.rstd) < 2e-6, seed
    assert rel(cst, cst_ref) < 1e-5
    g, u = (random_qweight(GGMLType.Q4_K, 40, K, device, seed + i, n) for i, n in ((4, "gate"), (5, "up")))
    got = gemv(x, [g, u], nan_vector(40, device), norm_weight=nw, swiglu=True, config=cfg, q8=q8)
    xq = dequantize_q8(q8, K)
    want = F.silu(gemv_naive(xq, [g]).double() * q8.rstd.double()) * gemv_naive(xq, [u]).double() * q8.rstd.double()
    assert rel(got, want) < 2e-6, seed
    d = random_qweight(GGMLType.Q4_K, 16, K, device, seed + 6, "down")
    h = torch.randn(16, device=device)
    h0 = h.clone()
    gemv(x, [d], h, residual=h, config=cfg, q8=q8)
    assert rel(h, h0 + gemv_naive(dequantize_q8(q8, K), [d])) < 2e-6, seed


def test_x8_does_not_apply_without_whole_q4_k_steps(device):
    """No Q4_K matrix, or a step that does not divide its blocks: the fp32 path runs, unchanged."""
    q6 = random_qweight(GGMLType.Q6_K, 9, 512, device, seed=fresh_seed())
    q4 = random_qweight(GGMLType.Q4_K, 9, 768, device, seed=fresh_seed())  # 3 blocks: BB = 2 does not divide
    cfg = GemvConfig(4, 2, 4, x8=True)
    for w in (q6, q4):
        assert not x8_applies(cfg, [w])
        x = torch.randn(w.cols, device=device)
        assert rel(gemv(x, [w], nan_vector(9, device), config=cfg), gemv_naive(x, [w])) < 2e-5


@pytest.mark.parametrize("cols", [512, 1536])  # one and three Q6_K block pairs: even and odd blocks
def test_x8_q6_k_equals_the_dequantized_int8_x(device, cols):
    seed = fresh_seed()
    w = random_qweight(GGMLType.Q6_K, 37, cols, device, seed=seed)
    x, nw = torch.randn(cols, device=device), torch.rand(cols, device=device) + 0.5
    for cfg in (GemvConfig(4, 2, 4, words=True, x8_q6=True), GemvConfig(16, 2, 2, x8_q6=True)):
        assert x8_applies(cfg, [w])
        q8 = Q8Vector.empty(cols, device)
        out = gemv(x, [w], nan_vector(37, device), norm_weight=nw, config=cfg, q8=q8)
        exact = gemv_naive(dequantize_q8(q8, cols), [w]) * q8.rstd
        assert rel(out, exact) < 2e-6, (cfg, seed)
        assert rel(out, gemv_naive(x, [w], norm_weight=nw)) < 2e-2, (cfg, seed)


def test_x8_per_type_flags_in_one_launch(device):
    """x8 (Q4_K) and x8_q6 (Q6_K) each switch only their own type; an odd step keeps Q6_K on fp32 x."""
    seed, K = fresh_seed(), 512
    ws = [random_qweight(GGMLType.Q6_K, 24, K, device, seed, "a"), random_qweight(GGMLType.Q4_K, 20, K, device, seed + 1, "b")]
    x, nw = torch.randn(K, device=device), torch.rand(K, device=device) + 0.5
    fp32 = gemv_naive(x, ws, norm_weight=nw)
    for cfg, q4_on, q6_on in ((GemvConfig(8, 2, 4, x8=True), True, False), (GemvConfig(8, 2, 4, x8_q6=True), False, True),
                              (GemvConfig(8, 2, 4, x8=True, x8_q6=True), True, True),
                              (GemvConfig(8, 1, 4, x8=True, x8_q6=True), True, False)):
        assert x8_paths(cfg, ws) == (q4_on, q6_on)
        q8 = Q8Vector.empty(K, device)
        out = gemv(x, ws, nan_vector(44, device), norm_weight=nw, config=cfg, q8=q8)
        xq = dequantize_q8(q8, K)
        for sl, w, on in ((slice(0, 24), ws[0], q6_on), (slice(24, 44), ws[1], q4_on)):
            if on:
                assert rel(out[sl], gemv_naive(xq, [w]) * q8.rstd) < 2e-6, (cfg, seed)
            else:
                assert rel(out[sl], fp32[sl]) < 2e-5, (cfg, seed)
