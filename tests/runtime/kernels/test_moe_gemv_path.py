"""Routed-expert decode GEMVs on the dense GEMV's dot paths (moe_experts/gemv_path.py) against the naive twins:
byte-wise, word-wise and int8-x, split and fused down, interpreter on CPU, CUDA when present. The int8-x paths are
checked exactly against the same arithmetic on the dequantized int8 x, so a wrong slot or block offset cannot hide
inside the rounding tolerance."""
import pytest
import torch
import torch.nn.functional as F

from runtime.gguf.types import GGMLType
from runtime.kernels.moe_experts import (ExpertTile, experts_down_gemv, experts_down_gemv_naive, experts_swiglu_gemv,
                                         experts_swiglu_gemv_naive)
from runtime.kernels.moe_experts.gemv_path import path_flags
from runtime.kernels.moe_experts.naive import _expert
from runtime.kernels.quant_x import Q8Vector, dequantize_q8
from runtime.triton.weights import random_qweight

E, D, FF = 8, 512, 256  # K steps: 2 (d) and 1 (ff) super-blocks


def rel(a, b):
    return float((a - b).norm() / b.norm())


def stack(qtype, rows, cols, device, seed):
    return random_qweight(qtype, E * rows, cols, device, seed=seed).data


def inputs(device, k=3):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(D, generator=g).to(device)
    norm = (1 + 0.1 * torch.randn(D, generator=g)).to(device)
    ids = torch.tensor([5, 0, 7, 2][:k], dtype=torch.int32, device=device)
    w = torch.tensor([0.4, 0.3, 0.2, 0.1][:k], device=device)
    return g, x, norm, ids, w


@pytest.mark.parametrize("gt, dt, tile", [
    (GGMLType.Q4_K, GGMLType.Q6_K, ExpertTile(16, 16, True, 4, "bytes", 2)),
    (GGMLType.Q4_K, GGMLType.Q6_K, ExpertTile(16, 16, True, 4, "words", 2)),
    (GGMLType.Q4_K, GGMLType.Q6_K, ExpertTile(16, 16, False, 4, "words", 2)),
    (GGMLType.Q8_0, GGMLType.F32, ExpertTile(16, 16, True, 4, "bytes", 4)),  # 16 Q8_0 steps, 4 a step
    (GGMLType.Q6_K, GGMLType.Q4_K, ExpertTile(16, 16, True, 2, "words", 2)),
])
def test_fp32_x_paths_match_the_twins(device, gt, dt, tile):
    gate, up, down = stack(gt, FF, D, device, 1), stack(gt, FF, D, device, 2), stack(dt, D, FF, device, 3)
    g, x, norm, ids, w = inputs(device)
    act = torch.full((3, FF), float("nan"), device=device)
    experts_swiglu_gemv(x, norm, 1e-6, gate, gt, up, gt, ids, FF, act, tile=tile)
    want = experts_swiglu_gemv_naive(x, norm, 1e-6, gate, gt, up, gt, ids, FF)
    assert rel(act, want) < 2e-5
    res, shared, slog = torch.randn(D, generator=g).to(device), torch.randn(D, generator=g).to(device), \
        torch.tensor([0.7], device=device)
    out = res.clone()
    part = torch.full((3, D), float("nan"), device=device)
    experts_down_gemv(act, down, dt, ids, w, out, out, shared=shared, shared_logit=slog, tile=tile, part=part)
    want = experts_down_gemv_naive(act, down, dt, ids, w, res, shared=shared, shared_logit=slog)
    assert rel(out, want) < 2e-5


def test_the_words_path_is_taken_where_it_fits_and_bytes_where_it_does_not(device):
    q4, q6 = stack(GGMLType.Q4_K, FF, D, device, 1), stack(GGMLType.Q6_K, D, FF, device, 2)
    assert path_flags("words", GGMLType.Q4_K, q4, D, 2)["WORDS"]
    assert not path_flags("words", GGMLType.Q6_K, q6, FF, 2)["WORDS"]  # one Q6_K block: no whole pair of 2
    assert path_flags("words", GGMLType.Q6_K, q6, FF, 2)["KMASK"]  # ... so the byte-wise path, masked
    assert path_flags("x8q6", GGMLType.Q4_K, q4, D, 2)["X8"] and not path_flags("bytes", GGMLType.Q4_K, q4, D, 2)["X8"]
    with pytest.raises(ValueError, match="path"):
        ExpertTile(path="fast")
    assert ExpertTile.parse("s16d16w4split-x8q6bb4") == ExpertTile(16, 16, True, 4, "x8q6", 4)
    assert ExpertTile.parse("s8d16w2-words") == ExpertTile(8, 16, False, 2, "words", 2)
    assert ExpertTile.parse("s16d16w4split-x8bb2-shared") == ExpertTile(16, 16, True, 4, "x8", 2, True)
    with pytest.raises(ValueError, match="only on the dense GEMV paths"):
        ExpertTile.parse("s16d16w4split-shared")


@pytest.mark.parametrize("split", [True, False])
def test_int8_x_paths_are_the_arithmetic_on_the_dequantized_int8_x(device, split):
    d, ff = D, 512  # the down's K = 512: a Q6_K block pair, so both stacks take the int8-x path
    gate, up = stack(GGMLType.Q4_K, ff, d, device, 1), stack(GGMLType.Q4_K, ff, d, device, 2)
    down = stack(GGMLType.Q6_K, d, ff, device, 3)
    tile = ExpertTile(16, 16, split, 4, "x8q6", 2)
    assert path_flags("x8q6", GGMLType.Q6_K, down, ff, 2)["X8Q6"]
    g, x, norm, ids, w = inputs(device, k=4)
    q8x, q8a = Q8Vector.empty(d, device), Q8Vector.empty(4 * ff, device)
    act = torch.empty(4, ff, device=device)
    experts_swiglu_gemv(x, norm, 1e-6, gate, GGMLType.Q4_K, up, GGMLType.Q4_K, ids, ff, act, tile=tile, q8=q8x)
    xq, r = dequantize_q8(q8x, d).float(), float(q8x.rstd[0])
    exact = torch.stack([F.silu(_expert(gate, GGMLType.Q4_K, e, ff, d) @ xq * r)
                         * (_expert(up, GGMLType.Q4_K, e, ff, d) @ xq * r) for e in ids.tolist()])
    assert rel(act, exact) < 2e-5
    assert rel(act, experts_swiglu_gemv_naive(x, norm, 1e-6, gate, GGMLType.Q4_K, up, GGMLType.Q4_K, ids, ff)) < 3e-2
    res = torch.randn(d, generator=g).to(device)
    out = res.clone()
    experts_down_gemv(act, down, GGMLType.Q6_K, ids, w, out, out, tile=tile, part=torch.empty(4, d, device=device),
                      q8=q8a)
    aq = dequantize_q8(q8a, 4 * ff).float().view(4, ff)  # each slot's own row of blocks
    exact = res + sum(w[j] * (_expert(down, GGMLType.Q6_K, e, d, ff) @ aq[j]) for j, e in enumerate(ids.tolist()))
    assert rel(out, exact) < 2e-5
    assert rel(out, experts_down_gemv_naive(act, down, GGMLType.Q6_K, ids, w, res)) < 3e-2


def test_only_the_chosen_experts_are_read(device):
    """NaN in every expert not chosen: the gemv paths' row arithmetic must stay inside the chosen ones."""
    gate, up = stack(GGMLType.Q4_K, FF, D, device, 1), stack(GGMLType.Q4_K, FF, D, device, 2)
    down = stack(GGMLType.Q4_K, D, FF, device, 3)
    _, x, norm, _, w = inputs(device)
    ids = torch.tensor([5, 3, 7], dtype=torch.int32, device=device)  # expert 0 (where row arithmetic falls) poisoned
    for s, rows in ((gate, FF), (up, FF), (down, D)):
        v = s.view(E, rows, -1)
        for e in set(range(E)) - set(ids.tolist()):
            v[e].view(torch.int8)[..., :4] = -1  # d and dmin = f16 NaN (0xFFFF)
    tile = ExpertTile(16, 16, True, 4, "x8", 2)
    act = torch.empty(3, FF, device=device)
    experts_swiglu_gemv(x, norm, 1e-6, gate, GGMLType.Q4_K, up, GGMLType.Q4_K, ids, FF, act, tile=tile)
    out = torch.zeros(D, device=device)
    experts_down_gemv(act, down, GGMLType.Q4_K, ids, w, out, out, tile=tile, part=torch.empty(3, D, device=device))
    assert torch.isfinite(act).all() and torch.isfinite(out).all()


@pytest.mark.parametrize("tile", [ExpertTile(16, 16, True, 4, "words", 2), ExpertTile(16, 16, False, 4, "words", 2),
                                  ExpertTile(16, 16, True, 4, "x8q6", 2)], ids=["split", "fused", "x8q6"])
def test_the_shared_expert_folds_in_as_the_last_slot(device, tile):
    """One SwiGLU and one down launch for the k routed experts and the shared one: the routed rows as without it,
    the shared row and the down sum as the twins (the shared expert's own types: Q6_K gate/up, Q4_K down)."""
    d, ff = D, 512
    gate, up = stack(GGMLType.Q4_K, ff, d, device, 1), stack(GGMLType.Q4_K, ff, d, device, 2)
    down = stack(GGMLType.Q6_K, d, ff, device, 3)
    sg = random_qweight(GGMLType.Q6_K, ff, d, device, seed=4).data
    su = random_qweight(GGMLType.Q6_K, ff, d, device, seed=5).data
    sd = random_qweight(GGMLType.Q4_K, d, ff, device, seed=6).data
    g, x, norm, ids, w = inputs(device, k=3)
    slog = torch.tensor([-0.4], device=device)
    act = torch.full((4, ff), float("nan"), device=device)
    experts_swiglu_gemv(x, norm, 1e-6, gate, GGMLType.Q4_K, up, GGMLType.Q4_K, ids, ff, act, tile=tile,
                        shared=(sg, GGMLType.Q6_K, su, GGMLType.Q6_K))
    alone = torch.empty(3, ff, device=device)
    experts_swiglu_gemv(x, norm, 1e-6, gate, GGMLType.Q4_K, up, GGMLType.Q4_K, ids, ff, alone, tile=tile)
    assert torch.equal(act[:3], alone)
    xn = x * torch.rsqrt(x.pow(2).mean() + 1e-6) * norm
    deq = lambda m, t, rows, cols: _expert(m, t, 0, rows, cols)  # noqa: E731  (a one-expert stack)
    want_shared = F.silu(deq(sg, GGMLType.Q6_K, ff, d) @ xn) * (deq(su, GGMLType.Q6_K, ff, d) @ xn)
    tol = 3e-2 if tile.path.startswith("x8") else 2e-5
    assert rel(act[3], want_shared) < tol
    res = torch.randn(d, generator=g).to(device)
    out = res.clone()
    experts_down_gemv(act, down, GGMLType.Q6_K, ids, w, out, out, shared_logit=slog, tile=tile,
                      part=torch.full((4, d), float("nan"), device=device), shared_down=(sd, GGMLType.Q4_K))
    shared = deq(sd, GGMLType.Q4_K, d, ff) @ act[3]
    want = experts_down_gemv_naive(act[:3], down, GGMLType.Q6_K, ids, w, res, shared=shared, shared_logit=slog)
    assert rel(out, want) < tol


def test_folding_is_refused_where_it_cannot_hold(device):
    gate = stack(GGMLType.Q4_K, FF, D, device, 1)
    sg = random_qweight(GGMLType.Q4_K, FF, D, device, seed=4).data
    _, x, norm, ids, w = inputs(device)
    act = torch.empty(4, FF, device=device)
    with pytest.raises(ValueError, match="only on the dense GEMV paths"):
        experts_swiglu_gemv(x, norm, 1e-6, gate, GGMLType.Q4_K, gate, GGMLType.Q4_K, ids, FF, act,
                            tile=ExpertTile(16, 16, True), shared=(sg, GGMLType.Q4_K, sg, GGMLType.Q4_K))
    with pytest.raises(ValueError, match=r"out \[4, 256\]"):
        experts_swiglu_gemv(x, norm, 1e-6, gate, GGMLType.Q4_K, gate, GGMLType.Q4_K, ids, FF, act[:3],
                            tile=ExpertTile(16, 16, True, 4, "words"), shared=(sg, GGMLType.Q4_K, sg, GGMLType.Q4_K))
    down = stack(GGMLType.Q4_K, D, FF, device, 3)
    with pytest.raises(ValueError, match="its logit"):
        experts_down_gemv(act, down, GGMLType.Q4_K, ids, w, x, x, tile=ExpertTile(16, 16, True, 4, "words"),
                          part=torch.empty(4, D, device=device), shared_down=(down[:D], GGMLType.Q4_K))
    with pytest.raises(ValueError, match="rows for 3 experts"):
        experts_down_gemv(act, down, GGMLType.Q4_K, ids, w, x, x, tile=ExpertTile(16, 16, True, 4, "words"),
                          part=torch.empty(4, D, device=device))
