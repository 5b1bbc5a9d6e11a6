import pytest
import torch

from runtime.kernels.gdn_chunk import gdn_chunk, gdn_chunk_naive

DK = 128


def _inputs(t, hk, hv, g, device, strong_decay=False):
    cc = 2 * hk * DK + hv * DK
    u = torch.randn(t, cc, generator=g)
    alpha = torch.randn(t, hv, generator=g) * (3.0 if strong_decay else 1.0)
    b = torch.randn(t, hv, generator=g)
    ssm_a = -torch.rand(hv, generator=g) * (8.0 if strong_decay else 1.0) - 0.01
    dt = torch.randn(hv, generator=g) * 0.5
    state = torch.randn(hv, DK, DK, generator=g) * 0.1
    return [x.to(device) for x in (u, alpha, b, ssm_a, dt, state)]


@pytest.mark.parametrize("t,hk,hv", [(1, 1, 2), (70, 2, 4), (64, 1, 1)])
def test_gdn_chunk_matches_recurrent(t, hk, hv, device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    u, alpha, b, ssm_a, dt, state = _inputs(t, hk, hv, g, device)
    ref_state = state.clone()
    out = torch.full((t, hv, DK), float("nan"), device=device)
    o = gdn_chunk(u, alpha, b, ssm_a, dt, state, n_k_head=hk, out=out)
    ref = gdn_chunk_naive(u, alpha, b, ssm_a, dt, ref_state, n_k_head=hk)
    assert torch.isfinite(o).all() and torch.isfinite(state).all()
    rel = lambda x, y: ((x - y).norm() / y.norm()).item()  # noqa: E731
    tol = 1e-4 if device == "cpu" else 5e-3  # exact fp32 in the interpreter; tf32 tensor cores on the GPU
    assert rel(o, ref) < tol
    assert rel(state, ref_state) < tol


def test_gdn_chunk_strong_decay_and_split_calls(device):
    """Strongly decaying heads stay finite (γ underflows to 0), and two calls == one call."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    t, hk, hv = 100, 1, 2
    u, alpha, b, ssm_a, dt, state = _inputs(t, hk, hv, g, device, strong_decay=True)
    s_whole, s_split = state.clone(), state.clone()
    whole = gdn_chunk(u, alpha, b, ssm_a, dt, s_whole, n_k_head=hk)
    first = gdn_chunk(u[:37], alpha[:37], b[:37], ssm_a, dt, s_split, n_k_head=hk)
    second = gdn_chunk(u[37:], alpha[37:], b[37:], ssm_a, dt, s_split, n_k_head=hk)
    split = torch.cat([first, second])
    ref_state = state.clone()
    ref = gdn_chunk_naive(u, alpha, b, ssm_a, dt, ref_state, n_k_head=hk)
    assert torch.isfinite(whole).all()
    tol = 1e-4 if device == "cpu" else 5e-3
    assert ((whole - ref).norm() / ref.norm()).item() < tol
    assert ((split - ref).norm() / ref.norm()).item() < tol
    assert ((s_split - ref_state).norm() / ref_state.norm()).item() < tol


def test_gdn_chunk_rejects_bad_shapes(device):
    u = torch.zeros(4, 2 * 128 + 2 * 128, device=device)
    state = torch.zeros(2, 128, 128, device=device)
    z = torch.zeros(4, 2, device=device)
    with pytest.raises(ValueError, match="multiple of Hk"):
        gdn_chunk(u, z, z, z[0], z[0], state, n_k_head=3)
    with pytest.raises(ValueError, match=r"\[4, 2\]"):
        gdn_chunk(u, z[:, :1], z, z[0], z[0], state, n_k_head=1)
