import pytest
import torch

from runtime.gguf.types import GGMLType
from runtime.kernels.qgemm import dequantize_rows, qgemm, qgemm_naive, qgemm_swiglu, qgemm_swiglu_naive
from runtime.kernels.qgemm.naive import random_qweight

TYPES = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.F32, GGMLType.F16, GGMLType.BF16]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_naive_dequant_matches_gguf_package():
    gq = pytest.importorskip("gguf.quants")
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    for wtype in (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0):
        w = random_qweight(3, 512, wtype, generator=g)
        ref = torch.from_numpy(gq.dequantize(w.numpy(), int(wtype)).reshape(3, 512).copy())
        assert torch.equal(dequantize_rows(w, wtype, 512), ref), wtype.name


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_qgemm_matches_naive(wtype, device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    m, n, k = 19, 40, 512  # ragged M and N exercise the masks
    w = random_qweight(n, k, wtype, generator=g).to(device)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=torch.bfloat16)
    res = torch.randn(m, n, generator=g).to(device)
    out = torch.full((m, n), float("nan"), device=device)
    y = qgemm(x, w, wtype, k, out=out)
    ref = qgemm_naive(x, w, wtype, k)
    assert torch.isfinite(y).all()
    assert _rel(y, ref) < 1e-2  # bf16 operands; the interpreter rounds to bf16 differently from torch
    # in-place residual add into the output buffer
    out2 = res.clone()
    qgemm(x, w, wtype, k, out=out2, residual=out2)
    assert _rel(out2, ref + res) < 1e-2


@pytest.mark.parametrize("wtype", [GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
def test_qgemm_swiglu_matches_naive(wtype, device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    m, n, k = 17, 36, 256
    wg = random_qweight(n, k, wtype, generator=g, scale=0.1).to(device)
    wu = random_qweight(n, k, GGMLType.Q4_K, generator=g, scale=0.1).to(device)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)
    y = qgemm_swiglu(x, wg, wtype, wu, GGMLType.Q4_K, k, out=out)
    ref = qgemm_swiglu_naive(x, wg, wtype, wu, GGMLType.Q4_K, k)
    assert torch.isfinite(y.float()).all()
    assert _rel(y, ref) < 2e-2  # bf16 output


def test_qgemm_rejects_bad_shapes(device):
    w = random_qweight(8, 256, GGMLType.Q4_K).to(device)
    x = torch.zeros(4, 256, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="uint8"):
        qgemm(x, w[:, :100].contiguous(), GGMLType.Q4_K, 256)
    with pytest.raises(ValueError, match=r"\[M, 512\]"):
        qgemm(x, random_qweight(8, 512, GGMLType.Q4_K).to(device), GGMLType.Q4_K, 512)
    with pytest.raises(ValueError, match="unsupported"):
        qgemm(x, w, 2, 256)
