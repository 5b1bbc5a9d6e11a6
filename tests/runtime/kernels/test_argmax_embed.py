import pytest
import torch

from runtime.gguf import GGMLType
from runtime.kernels.argmax import ArgmaxWorkspace, argmax_to, argmax_to_naive
from runtime.kernels.embed import embed, embed_naive
from runtime.triton.weights import random_qweight


def test_argmax_two_stage_with_ties_and_advance(device):
    n = 10_000
    logits = torch.randn(n, device=device)
    ws = ArgmaxWorkspace(n, device, block=1024)
    tok = torch.full((1,), -1, dtype=torch.int32, device=device)
    pos = torch.tensor([7], dtype=torch.int32, device=device)
    argmax_to(logits, tok, ws, pos)
    assert tok.item() == torch.argmax(logits).item() and pos.item() == 8
    i, j = sorted(torch.randperm(n)[:2].tolist())
    logits[i] = logits[j] = logits.max() + 1  # a tie: lowest index wins, as torch.argmax
    argmax_to(logits, tok, ws)
    ref = argmax_to_naive(logits, tok.clone())
    assert tok.item() == i == ref.item() and pos.item() == 8


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.F32,
                                   GGMLType.BF16], ids=lambda t: t.name)
def test_embed_rows_match_dequantized_table(device, qtype):
    w = random_qweight(qtype, 50, 512, device, seed=int(torch.randint(0, 2**31, ()).item()))
    ids = torch.randint(0, 50, (3,), dtype=torch.int32, device=device)
    out = torch.full((3, 512), float("nan"), device=device)
    hist = torch.zeros(16, dtype=torch.int32, device=device)
    pos = torch.tensor([5], dtype=torch.int32, device=device)
    embed(w, ids, out, pos, hist)
    ref = embed_naive(w, ids, torch.empty_like(out))
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-7)
    assert hist[5:8].tolist() == ids.tolist() and hist[:5].eq(0).all()
