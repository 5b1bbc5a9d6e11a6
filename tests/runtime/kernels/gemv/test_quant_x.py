"""quantize_x (runtime/kernels/quant_x) against its torch twin: int8 blocks of x (times the norm
weight), their scales and sums, and 1 / rms."""
import pytest
import torch

from runtime.kernels.quant_x import Q8Vector, dequantize_q8, quantize_x, quantize_x_naive
from tests.runtime.kernels.gemv.gemv_helpers import fresh_seed


def _poisoned(capacity, device):
    q8 = Q8Vector.empty(capacity, device)
    q8.q.fill_(99)
    q8.ds.fill_(float("nan"))
    q8.rstd.fill_(float("nan"))
    return q8


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("K", [256, 2080])  # 2080: a partial last program, blocks of 32 only
def test_quantize_x_matches_naive(device, norm, K):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(K, generator=g)
    x[7] = 40.0  # an outlier: its block's other values lose precision, the rest keep theirs
    x[64:96] = 0.0  # an all-zero block: d = 0, q = 0, no NaN
    x, nw = x.to(device), (torch.rand(K, generator=g) + 0.5).to(device)
    w = nw if norm else None
    got = quantize_x(x, _poisoned(K + 64, device), w, 1e-6)
    want = quantize_x_naive(x, Q8Vector.empty(K, device), w, 1e-6)
    dq = (got.q[:K].int() - want.q.int()).abs()
    assert dq.max() <= 1 and (dq > 0).float().mean() < 1e-2, seed  # a product rounded either way at a tie
    assert torch.isfinite(got.ds[: K // 32]).all() and torch.isfinite(got.rstd).all()
    torch.testing.assert_close(got.ds[: K // 32, 0], want.ds[:, 0], rtol=1e-6, atol=0)
    # the sums are of the kernel's own q (where a tie rounded the other way, want's differ by d)
    q = got.q[:K].float().reshape(-1, 32)
    d = got.ds[: K // 32, 0]
    own = torch.stack([d * q.sum(1), d * q[:, :16].sum(1), d * q[:, 16:].sum(1)], 1)
    torch.testing.assert_close(got.ds[: K // 32, 1:], own, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.rstd, want.rstd, rtol=1e-5, atol=0)
    assert (got.q[64:96] == 0).all() and (got.ds[2] == 0).all()
    xe = x * nw if norm else x
    step = d.repeat_interleave(32)
    assert ((dequantize_q8(got, K) - xe).abs() <= step * 0.5 * (1 + 1e-5) + 1e-7).all(), seed  # half a step at most
    assert got.q.int().abs().max() <= 127


def test_quantize_x_rejects_bad_input(device):
    q8 = Q8Vector.empty(256, device)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_x(torch.zeros(100, device=device), q8)
    with pytest.raises(ValueError, match="at most 256"):
        quantize_x(torch.zeros(512, device=device), q8)
    with pytest.raises(ValueError, match="fp32"):
        quantize_x(torch.zeros(256, device=device, dtype=torch.float16), q8)
    with pytest.raises(ValueError, match="norm_weight"):
        quantize_x(torch.zeros(256, device=device), q8, torch.ones(128, device=device))
    with pytest.raises(ValueError, match="multiple of 32"):
        Q8Vector.empty(100, device)
