import pytest
import torch

from runtime.kernels.gated_norm import gated_norm, gated_norm_naive
from runtime.kernels.rmsnorm import rmsnorm, rmsnorm_naive


# 5 and 21 rows: one partial block of rows and one full plus a partial (16 rows a program under the interpreter)
@pytest.mark.parametrize("t", [5, 21])
def test_rmsnorm_matches_naive(t, device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = (torch.randn(t, 320, generator=g) * 3).to(device)
    w = torch.randn(320, generator=g).to(device)
    spare = torch.full((t + 20, 320), float("nan"), device=device, dtype=torch.bfloat16)
    y = rmsnorm(x, w, 1e-6, out=spare[:t])  # a view: rows past it must stay untouched
    assert torch.isfinite(y.float()).all() and torch.isnan(spare[t:].float()).all()
    torch.testing.assert_close(y.float(), rmsnorm_naive(x, w, 1e-6).float(), rtol=1e-2, atol=1e-2)
    y32 = rmsnorm(x, w, 1e-6, out_dtype=torch.float32)
    torch.testing.assert_close(y32, rmsnorm_naive(x, w, 1e-6, torch.float32), rtol=1e-5, atol=1e-5)


def test_gated_norm_matches_naive(device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    t, hv, dv = 21, 3, 128
    o = torch.randn(t, hv, dv, generator=g).to(device)
    z = torch.randn(t, hv * dv, generator=g).to(device)
    w = torch.randn(dv, generator=g).to(device)
    out = torch.full((t, hv * dv), float("nan"), device=device, dtype=torch.bfloat16)
    y = gated_norm(o, z, w, 1e-6, out=out)
    assert torch.isfinite(y.float()).all()
    torch.testing.assert_close(y.float(), gated_norm_naive(o, z, w, 1e-6).float(), rtol=1e-2, atol=1e-2)
