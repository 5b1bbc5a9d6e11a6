import pytest
import torch

from runtime.kernels.attn_prep import attn_prep, attn_prep_naive, rope_tables
from runtime.kernels.flash_attn import flash_attn, flash_attn_naive

DH = 256


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# 5 and 21 tokens: one partial block of rows and one full plus a partial (16 rows a program under the interpreter)
@pytest.mark.parametrize("t", [5, 21])
def test_attn_prep_matches_naive(t, device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    hq, hkv, pos0 = 4, 2, 7
    ctx = pos0 + t + 20  # room past the chunk, where a block's rows beyond it would land if written
    qg = torch.randn(t, 2 * hq * DH, generator=g).to(device)
    k = torch.randn(t, hkv * DH, generator=g).to(device)
    v = torch.randn(t, hkv * DH, generator=g).to(device)
    qn, kn = torch.randn(DH, generator=g).to(device), torch.randn(DH, generator=g).to(device)
    cos, sin = rope_tables(torch.arange(pos0, pos0 + t, device=device) * 1000, 64, 1e7)
    caches = [torch.full((ctx, hkv, DH), float("nan"), device=device, dtype=torch.bfloat16) for _ in range(4)]
    spare = torch.full((t + 20, hq, DH), float("nan"), device=device, dtype=torch.bfloat16)
    out = spare[:t]  # a view: rows past it must stay untouched
    q = attn_prep(qg, k, v, qn, kn, cos, sin, caches[0], caches[1], pos0, 1e-6, out=out)
    q_ref = attn_prep_naive(qg, k, v, qn, kn, cos, sin, caches[2], caches[3], pos0, 1e-6)
    assert torch.isfinite(q.float()).all() and torch.isnan(spare[t:].float()).all()
    assert _rel(q, q_ref) < 1e-2
    for mine, ref in zip(caches[:2], caches[2:]):
        assert torch.isfinite(mine[pos0 : pos0 + t].float()).all()
        assert _rel(mine[pos0 : pos0 + t], ref[pos0 : pos0 + t]) < 1e-2
        assert torch.isnan(mine[:pos0].float()).all()  # rows outside the chunk untouched
        assert torch.isnan(mine[pos0 + t :].float()).all()


@pytest.mark.parametrize("t,pos0,hq,hkv", [(37, 0, 4, 2), (9, 21, 2, 1), (1, 40, 2, 2)])
def test_flash_attn_matches_naive(t, pos0, hq, hkv, device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    ctx = pos0 + t + 5
    q = torch.randn(t, hq, DH, generator=g).to(device=device, dtype=torch.bfloat16)
    qg = torch.randn(t, 2 * hq * DH, generator=g).to(device)
    kc = torch.randn(ctx, hkv, DH, generator=g).to(device=device, dtype=torch.bfloat16)
    vc = torch.randn(ctx, hkv, DH, generator=g).to(device=device, dtype=torch.bfloat16)
    kc[pos0 + t :] = float("nan")  # rows past the chunk must never be read
    vc[pos0 + t :] = float("nan")
    ref = flash_attn_naive(q, qg, kc, vc, pos0)
    configs = [None] if device == "cuda" else [None, dict(BM=16, BN=16, BV=128, num_warps=1)]  # + value-column split
    for cfg in configs:
        out = torch.full((t, hq * DH), float("nan"), device=device, dtype=torch.bfloat16)
        o = flash_attn(q, qg, kc, vc, pos0, out=out, config=cfg)
        assert torch.isfinite(o.float()).all()
        assert _rel(o, ref) < 2e-2


def test_flash_attn_rejects_overflow(device):
    q = torch.zeros(4, 2, DH, device=device, dtype=torch.bfloat16)
    c = torch.zeros(6, 1, DH, device=device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do not fit"):
        flash_attn(q, torch.zeros(4, 4 * DH, device=device), c, c, 3)
