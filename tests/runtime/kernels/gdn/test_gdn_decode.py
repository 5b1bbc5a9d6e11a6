import pytest
import torch

from runtime.kernels.gdn_decode import gdn_decode_step, gdn_decode_step_naive


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("hk,hv,block_v", [(2, 4, None), (1, 1, None), (2, 4, 8), (1, 2, 16)])
def test_gdn_decode_step_matches_naive_over_steps(device, hk, hv, block_v):
    dk = dv = 32 if device == "cpu" else 128
    state = torch.randn(hv, dk, dv, device=device) * 0.1
    state_ref = state.clone()
    ssm_a = -torch.rand(hv, device=device) * 4  # = -exp(A_log)
    dt_bias = torch.randn(hv, device=device)
    nw = torch.rand(dv, device=device) + 0.5
    for _ in range(3):  # several tokens: state carried
        proj = torch.randn(2 * hk * dk + 2 * hv * dv + 2 * hv, device=device)
        proj[-hv:] *= 10  # large a: exercises the softplus linear branch
        out = torch.full((hv * dv,), float("nan"), device=device)
        gdn_decode_step(proj, state, ssm_a, dt_bias, nw, out, n_k_head=hk, block_v=block_v)
        ref = gdn_decode_step_naive(proj, state_ref, ssm_a, dt_bias, nw, torch.empty_like(out), n_k_head=hk)
        # fp32 with another reduction order, carried over steps: ~1e-5 seen; a wrong gate or decay is ~1e-1
        assert _rel(out, ref) < 5e-5
        assert _rel(state, state_ref) < 5e-5


def test_gdn_decode_step_rejects_bad_sizes(device):
    state = torch.zeros(4, 32, 32, device=device)
    z = torch.zeros(4, device=device)
    with pytest.raises(ValueError, match="proj"):
        gdn_decode_step(torch.zeros(10, device=device), state, z, z, torch.zeros(32, device=device),
                        torch.zeros(128, device=device), n_k_head=2)
    with pytest.raises(ValueError, match="multiple"):
        gdn_decode_step(torch.zeros(10, device=device), state, z, z, torch.zeros(32, device=device),
                        torch.zeros(128, device=device), n_k_head=3)
