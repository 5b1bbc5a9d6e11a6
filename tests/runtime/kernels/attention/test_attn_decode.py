import pytest
import torch

from runtime.kernels.attn_decode import AttnConfig, AttnWorkspace, attention_decode, attention_decode_naive


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


CONFIGS = {
    "tf32": AttnConfig(block_t=16, lowp=False, combine_block_d=None, num_stages=None),
    "lowp": AttnConfig(block_t=16, lowp=True, combine_block_d=None),
    "default": AttnConfig(),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("n_split,pos", [(4, 0), (4, 37), (1, 90), (8, 150), (8, 3), (64, 150)])
def test_attention_decode_matches_naive(device, n_split, pos, config):
    hq, hkv, dh, ctx = 4, 2, 256, 160
    kw = dict(n_head=hq, n_kv_head=hkv, head_dim=dh, rope_dims=64, rope_base=1e7)
    kc = (torch.randn(ctx, hkv, dh, device=device)).to(torch.bfloat16)
    vc = torch.randn(ctx, hkv, dh, device=device).to(torch.bfloat16)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    proj = torch.randn(2 * hq * dh + 2 * hkv * dh, device=device) * 3
    qn, kn = torch.rand(dh, device=device) + 0.5, torch.rand(dh, device=device) + 0.5
    p = torch.tensor([pos], dtype=torch.int32, device=device)
    out = torch.full((hq * dh,), float("nan"), device=device)
    ws = AttnWorkspace(hq, dh, n_split, device)
    ws.acc.fill_(float("nan"))  # stale partials of empty splits must not reach the output
    attention_decode(proj, qn, kn, p, kc, vc, out, ws, config=CONFIGS[config], **kw)
    ref = attention_decode_naive(proj, qn, kn, p, kc_ref, vc_ref, torch.empty_like(out), **kw)
    assert _rel(kc[pos].float(), kc_ref[pos].float()) < 1e-2  # bf16 rounding of the appended row
    assert _rel(vc.float(), vc_ref.float()) < 1e-2  # the interpreter may truncate to bf16, the GPU rounds
    assert torch.equal(vc[:pos], vc_ref[:pos]) and torch.equal(vc[pos + 1 :], vc_ref[pos + 1 :])  # only row pos written
    assert _rel(out, ref) < 2e-2, _rel(out, ref)  # bf16 q/k/p in the dots


def test_attention_decode_rejects_bad_sizes(device):
    ws = AttnWorkspace(4, 256, 2, device)
    kc = torch.zeros(8, 2, 256, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="proj"):
        attention_decode(torch.zeros(5, device=device), None, None, torch.zeros(1, dtype=torch.int32, device=device),
                         kc, kc, torch.zeros(1024, device=device), ws, n_head=4, n_kv_head=2, head_dim=256,
                         rope_dims=64, rope_base=1e7)


@pytest.mark.parametrize("bad", [dict(block_t=8), dict(block_t=48), dict(combine_block_d=100)])
def test_attn_config_rejects_odd_tiles(bad):
    with pytest.raises(ValueError, match="power of two"):
        AttnConfig(**bad)
