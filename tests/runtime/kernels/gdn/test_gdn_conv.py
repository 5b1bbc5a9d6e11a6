import pytest
import torch

from runtime.kernels.gdn_conv import gdn_conv, gdn_conv_naive


@pytest.mark.parametrize("t", [1, 2, 37])
def test_gdn_conv_matches_naive_and_carries_state(t, device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    c = 96
    x = torch.randn(t, c, generator=g).to(device)
    w = torch.randn(c, 4, generator=g).to(device)
    state = torch.randn(3, c, generator=g).to(device)
    ref_state = state.clone()
    out = torch.full((t, c), float("nan"), device=device)
    y = gdn_conv(x, w, state, out=out)
    ref = gdn_conv_naive(x, w, ref_state)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=0)


def test_gdn_conv_split_equals_one_pass(device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    c = 64
    x = torch.randn(20, c, generator=g).to(device)
    w = torch.randn(c, 4, generator=g).to(device)
    s1, s2 = torch.zeros(3, c, device=device), torch.zeros(3, c, device=device)
    whole = gdn_conv(x, w, s1)
    parts = torch.cat([gdn_conv(x[a:b], w, s2) for a, b in [(0, 2), (2, 3), (3, 13), (13, 20)]])
    torch.testing.assert_close(parts, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(s2, s1)


def test_gdn_conv_rejects_bad_state(device):
    with pytest.raises(ValueError, match=r"\[3, 8\]"):
        gdn_conv(torch.zeros(4, 8, device=device), torch.zeros(8, 4, device=device), torch.zeros(2, 8, device=device))
