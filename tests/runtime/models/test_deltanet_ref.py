"""The GDN reference ops against independent formulations (fp64 for tight tolerances)."""
import pytest
import torch
import torch.nn.functional as F

from runtime.models.deltanet_ref import (
    causal_conv1d_ref,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    gated_rms_norm_ref,
    gdn_gates,
    l2_normalize,
)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    # Tiny ops on a shared 2-core box: a second OpenMP thread only spins (3x slower under load).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


F64 = torch.float64


def gdn_inputs(T, hk=2, hv=4, dk=16, dv=8, seed=0, dtype=F64, strong_decay=False):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    q = l2_normalize(rnd(T, hk, dk))
    k = l2_normalize(rnd(T, hk, dk))
    v = rnd(T, hv, dv)
    g = -torch.rand(T, hv, generator=gen, dtype=dtype) * (30.0 if strong_decay else 1.0)
    beta = torch.rand(T, hv, generator=gen, dtype=dtype)
    state = rnd(hv, dk, dv)
    return q, k, v, g, beta, state


def naive_per_head(q, k, v, g, beta, state, scale):
    """§5.6's closed form S_t = λ(I − β k kᵀ)S + β k vᵀ, o = Sᵀ q, one head at a time, κ(j) = j mod Hk."""
    T, hk, dk = q.shape
    hv = v.shape[1]
    outs, finals = torch.empty(T, hv, v.shape[2], dtype=q.dtype), []
    eye = torch.eye(dk, dtype=q.dtype)
    for j in range(hv):
        S = state[j].clone()
        kj, qj = k[:, j % hk], q[:, j % hk] * scale
        for t in range(T):
            lam, b = torch.exp(g[t, j]), beta[t, j]
            S = lam * (eye - b * torch.outer(kj[t], kj[t])) @ S + b * torch.outer(kj[t], v[t, j])
            outs[t, j] = S.T @ qj[t]
        finals.append(S)
    return outs, torch.stack(finals)


def test_recurrent_matches_closed_form_and_tiled_head_mapping():
    q, k, v, g, beta, s0 = gdn_inputs(20)
    o, s = gated_delta_rule_recurrent(q, k, v, g, beta, s0, scale=0.25)
    o_ref, s_ref = naive_per_head(q, k, v, g, beta, s0, 0.25)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T,chunk", [(150, 64), (64, 64), (5, 64), (37, 8), (10, 1)], ids=lambda x: str(x))
def test_chunked_equals_recurrent(T, chunk):
    q, k, v, g, beta, s0 = gdn_inputs(T, seed=T)
    o_r, s_r = gated_delta_rule_recurrent(q, k, v, g, beta, s0, scale=0.3)
    o_c, s_c = gated_delta_rule_chunked(q, k, v, g, beta, s0, scale=0.3, chunk_size=chunk)
    torch.testing.assert_close(o_c, o_r, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_c, s_r, rtol=1e-10, atol=1e-10)


def test_chunked_strong_decay_is_finite_and_exact():
    # g down to -30 per token: cumulative decays underflow and masked exponents would overflow.
    q, k, v, g, beta, s0 = gdn_inputs(130, seed=3, strong_decay=True)
    o_r, s_r = gated_delta_rule_recurrent(q, k, v, g, beta, s0)
    o_c, s_c = gated_delta_rule_chunked(q, k, v, g, beta, s0)
    assert torch.isfinite(o_c).all() and torch.isfinite(s_c).all()
    torch.testing.assert_close(o_c, o_r, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_c, s_r, rtol=1e-10, atol=1e-10)
    # fp32 too: the chunked form must not produce inf * 0 = NaN
    f32 = [x.float() for x in (q, k, v, g, beta, s0)]
    assert torch.isfinite(gated_delta_rule_chunked(*f32)[0]).all()


def test_chunked_state_carries_across_calls_and_zero_initial_state():
    q, k, v, g, beta, _ = gdn_inputs(100, seed=7)
    o_full, s_full = gated_delta_rule_chunked(q, k, v, g, beta)
    o_a, s_a = gated_delta_rule_chunked(q[:45], k[:45], v[:45], g[:45], beta[:45])
    o_b, s_b = gated_delta_rule_chunked(q[45:], k[45:], v[45:], g[45:], beta[45:], s_a)
    torch.testing.assert_close(torch.cat([o_a, o_b]), o_full, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(s_b, s_full, rtol=1e-11, atol=1e-11)


def test_delta_rule_rejects_bad_shapes():
    q, k, v, g, beta, s0 = gdn_inputs(4)
    with pytest.raises(ValueError, match="state shape"):
        gated_delta_rule_recurrent(q, k, v, g, beta, s0[:, :3])
    with pytest.raises(ValueError, match="multiple of Hk"):
        gated_delta_rule_chunked(q, k, v[:, :3], g[:, :3], beta[:, :3])


def test_inputs_are_not_mutated():
    q, k, v, g, beta, s0 = gdn_inputs(70)
    before = s0.clone()
    gated_delta_rule_chunked(q, k, v, g, beta, s0)
    gated_delta_rule_recurrent(q, k, v, g, beta, s0)
    assert torch.equal(s0, before)


def test_conv_with_state_equals_full_conv():
    gen = torch.Generator().manual_seed(1)
    T, C, K = 23, 12, 4
    x = torch.randn(T, C, generator=gen, dtype=F64)
    w = torch.randn(C, K, generator=gen, dtype=F64)
    # PyTorch conv1d (cross-correlation, left pad K-1) is the definition in §5.2.
    full = F.silu(F.conv1d(F.pad(x.T[None], (K - 1, 0)), w[:, None, :], groups=C)[0].T)
    y_all, st_all = causal_conv1d_ref(x, w)
    torch.testing.assert_close(y_all, full, rtol=1e-12, atol=1e-12)
    pieces, state = [], None
    for a, b in [(0, 1), (1, 3), (3, 4), (4, 15), (15, 23)]:  # pieces shorter than the kernel too
        y, state = causal_conv1d_ref(x[a:b], w, state)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces), full, rtol=1e-12, atol=1e-12)
    assert torch.equal(state, x[-(K - 1) :]) and torch.equal(st_all, state)  # raw inputs, not SiLU outputs
    y_raw, _ = causal_conv1d_ref(x, w, silu=False)
    torch.testing.assert_close(F.silu(y_raw), full, rtol=1e-12, atol=1e-12)


def test_gates_stable_and_signed():
    alpha = torch.tensor([[-50.0, 0.0, 30.0, 1e4]])
    b = torch.tensor([[-3.0, 0.0, 3.0, 100.0]])
    ssm_a = torch.tensor([-0.5, -1.0, -2.0, -4.0])
    dt = torch.tensor([0.1, 0.2, 0.3, 0.4])
    g, beta = gdn_gates(alpha, b, ssm_a, dt)
    assert torch.isfinite(g).all() and (g <= 0).all()
    torch.testing.assert_close(g[0, 3], torch.tensor(-4.0 * (1e4 + 0.4)))  # linear branch, no overflow
    torch.testing.assert_close(g[0, 1], -1.0 * torch.log1p(torch.exp(torch.tensor(0.2))))
    torch.testing.assert_close(beta, torch.sigmoid(b))


def test_l2_normalize_eps_inside_root():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=F64)
    y = l2_normalize(x)
    torch.testing.assert_close(y[0], x[0] / torch.sqrt(torch.tensor(25.0 + 1e-6, dtype=F64)))
    assert torch.equal(y[1], torch.zeros(2, dtype=F64))


def test_gated_rms_norm_no_offset():
    gen = torch.Generator().manual_seed(2)
    o, z = torch.randn(3, 2, 8, generator=gen, dtype=F64), torch.randn(3, 2, 8, generator=gen, dtype=F64)
    w = torch.rand(8, generator=gen, dtype=F64)
    rms = torch.sqrt((o**2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(gated_rms_norm_ref(o, z, w, 1e-6), o / rms * w * z * torch.sigmoid(z))
