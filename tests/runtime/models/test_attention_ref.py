"""Attention, RoPE and RMSNorm references against explicit loops / closed forms."""
import math

import pytest
import torch

from runtime.models.attention_ref import apply_rope_ref, attention_ref, rms_norm_ref, rope_cos_sin


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    # Tiny ops on a shared 2-core box: a second OpenMP thread only spins (3x slower under load).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


F64 = torch.float64


def naive_attention(q, k, v, scale):
    Tq, hq, dh = q.shape
    Tk, hkv, _ = k.shape
    group = hq // hkv
    out = torch.zeros_like(q)
    for h in range(hq):
        j = h // group  # consecutive GQA groups
        for i in range(Tq):
            pos = Tk - Tq + i
            s = torch.stack([q[i, h] @ k[t, j] * scale for t in range(pos + 1)])
            p = torch.exp(s - s.max())
            p = p / p.sum()
            out[i, h] = sum(p[t] * v[t, j] for t in range(pos + 1))
    return out


@pytest.mark.parametrize("Tq,Tk", [(7, 7), (1, 9), (3, 10)], ids=lambda x: str(x))
def test_attention_matches_loop(Tq, Tk):
    gen = torch.Generator().manual_seed(Tq * 100 + Tk)
    q = torch.randn(Tq, 4, 8, generator=gen, dtype=F64)
    k = torch.randn(Tk, 2, 8, generator=gen, dtype=F64)
    v = torch.randn(Tk, 2, 8, generator=gen, dtype=F64)
    expect = naive_attention(q, k, v, 8**-0.5)
    torch.testing.assert_close(attention_ref(q, k, v), expect, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attention_ref(q, k, v, q_block=2), expect, rtol=1e-12, atol=1e-12)


def test_attention_rejects_bad_shapes():
    q = torch.zeros(3, 4, 8)
    with pytest.raises(ValueError, match="only 2 keys"):
        attention_ref(q, torch.zeros(2, 2, 8), torch.zeros(2, 2, 8))
    with pytest.raises(ValueError, match="multiple of Hkv"):
        attention_ref(q, torch.zeros(3, 3, 8), torch.zeros(3, 3, 8))


def test_rope_half_split_on_first_dims_only():
    rope_dims, base, D = 16, 1e7, 32
    pos = torch.tensor([0, 1, 5, 1000])
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, D, generator=gen, dtype=F64)
    cos, sin = rope_cos_sin(pos, rope_dims, base, dtype=F64)
    y = apply_rope_ref(x, cos, sin)
    half = rope_dims // 2
    assert torch.equal(y[0], x[0])  # position 0 is the identity
    assert torch.equal(y[..., rope_dims:], x[..., rope_dims:])  # pass-through dims
    # pair (i, i + half) rotates as the complex number x_i + i x_{i+half} times e^{i theta_i(p)}
    for t, p in enumerate(pos.tolist()):
        for i in range(half):
            theta = p * base ** (-2 * i / rope_dims)
            z = complex(1, 0) * torch.complex(x[t, :, i], x[t, :, i + half]) * complex(math.cos(theta), math.sin(theta))
            torch.testing.assert_close(y[t, :, i], z.real)
            torch.testing.assert_close(y[t, :, i + half], z.imag)


def test_rms_norm():
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]], dtype=F64)
    w = torch.tensor([1.0, 2.0, 0.5, 1.5], dtype=F64)
    expect = x / torch.sqrt((x**2).mean() + 1e-6) * w
    torch.testing.assert_close(rms_norm_ref(x, w, 1e-6), expect)
