import pytest
import torch

from runtime.gguf.types import GGMLType
from runtime.kernels.qgemm import dequantize_matrix, dequantize_rows, gather_rows, gather_rows_naive
from runtime.kernels.qgemm.naive import random_qweight


@pytest.mark.parametrize("wtype", [GGMLType.Q6_K, GGMLType.Q4_K, GGMLType.F32], ids=lambda t: t.name)
def test_gather_rows_matches_naive(wtype, device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    v, d = 50, 256
    w = random_qweight(v, d, wtype, generator=g).to(device)
    ids = torch.randint(0, v, (19,), generator=g).to(device)
    out = torch.full((19, d), float("nan"), device=device)
    y = gather_rows(w, wtype, ids, d, out=out)
    assert torch.equal(y, gather_rows_naive(w, wtype, ids, d))


def test_gather_rows_rejects_out_of_range_ids(device):
    w = random_qweight(10, 256, GGMLType.Q4_K).to(device)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        gather_rows(w, GGMLType.Q4_K, torch.tensor([3, 10], device=device), 256)


def test_dequantize_matrix_bf16_scratch(device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    w = random_qweight(40, 256, GGMLType.Q5_K, generator=g).to(device)
    out = torch.full((40, 256), float("nan"), device=device, dtype=torch.bfloat16)
    dequantize_matrix(w, GGMLType.Q5_K, 256, out=out)
    ref = dequantize_rows(w, GGMLType.Q5_K, 256)
    torch.testing.assert_close(out.float(), ref, rtol=8e-3, atol=1e-6)
