"""MoE kernels against their naive twins at tiny shapes (interpreter on CPU, CUDA when present)."""
import pytest
import torch

from runtime.gguf.types import GGMLType
from runtime.kernels.moe_experts import (ExpertTile, GroupedTile, experts_down_gemv, experts_down_gemv_naive,
                                         experts_swiglu_gemv, experts_swiglu_gemv_naive, grouped_experts,
                                         grouped_experts_naive, sort_by_expert)
from runtime.kernels.moe_route import moe_route, moe_route_naive
from runtime.triton.weights import random_qweight

E, D, FF = 8, 128, 64  # experts, d_model, expert width (multiples of the 64-column tile, K-quant rows of 256 below)


def test_route_matches_twin_and_renormalises(device):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 40, generator=g) * 3).to(device)  # E not a power of two: padding masked
    ids, w = moe_route(logits, 6)
    ids_n, w_n = moe_route_naive(logits, 6)
    assert torch.equal(ids.cpu(), ids_n.cpu())
    assert torch.allclose(w.cpu(), w_n.cpu(), atol=1e-6)
    assert torch.allclose(w.sum(-1).cpu(), torch.ones(5), atol=1e-6)


def test_route_reads_strided_rows_and_all_experts(device):
    full = torch.full((3, 20), -50.0, device=device)
    full[:, 16 + 0] = 5.0  # the last column of the E = 17 view wins: no off-by-one at the tail
    full[:, 3] = 4.0
    ids, w = moe_route(full[:, :17], 2)  # rows of stride 20
    assert ids.cpu().tolist() == [[16, 3]] * 3
    assert w.cpu()[0, 0] > w.cpu()[0, 1]


def _stack(qtype, n_expert, rows, cols, device, seed):
    return random_qweight(qtype, n_expert * rows, cols, device, seed=seed)


# torch ops that read a device value back to the host (a sync on CUDA), as far as the MoE prefill could use them
HOST_READS = {"item", "tolist", "cpu", "numpy", "nonzero", "bincount", "unique", "masked_select", "__bool__",
              "__int__", "__float__", "__index__", "repeat_interleave", "unique_consecutive", "histc"}


class HostReads(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in HOST_READS or (name == "__getitem__" and len(args) > 1 and isinstance(args[1], torch.Tensor)
                                  and args[1].dtype == torch.bool):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_sort_by_expert_never_reads_back_to_the_host(device):
    """It runs once per MoE layer of every prefill: a host read there stalls the launch queue 40 times a prompt."""
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], dtype=torch.int32, device=device)
    with HostReads() as mode:
        s = sort_by_expert(ids, 4, 4)
    assert mode.seen == []
    with HostReads() as mode:  # the detector sees the op it must (what sort_by_expert once called)
        torch.bincount(ids.reshape(-1).long(), minlength=4)
    assert mode.seen == ["bincount"]
    assert s.slot_of_row.cpu().tolist()[:4] == [1, 4, -1, -1]


@pytest.mark.parametrize("gt, dt, tile", [(GGMLType.Q4_K, GGMLType.Q6_K, ExpertTile()),
                                          (GGMLType.Q8_0, GGMLType.F32, ExpertTile()),
                                          (GGMLType.Q4_K, GGMLType.Q6_K, ExpertTile(16, 16, split_down=True))])
def test_decode_expert_gemvs_match_twins(device, gt, dt, tile):
    d, ff = 256, 256
    gate, up = _stack(gt, E, ff, d, device, 1), _stack(gt, E, ff, d, device, 2)
    down = _stack(dt, E, d, ff, device, 3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(d, generator=g).to(device)
    norm = (1 + 0.1 * torch.randn(d, generator=g)).to(device)
    ids = torch.tensor([5, 0, 7], dtype=torch.int32, device=device)
    w = torch.tensor([0.5, 0.3, 0.2], device=device)
    act = torch.empty(3, ff, device=device)
    experts_swiglu_gemv(x, norm, 1e-6, gate.data, gt, up.data, gt, ids, ff, act, tile=tile)
    want = experts_swiglu_gemv_naive(x, norm, 1e-6, gate.data, gt, up.data, gt, ids, ff)
    assert torch.allclose(act, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    res = torch.randn(d, generator=g).to(device)
    shared, slog = torch.randn(d, generator=g).to(device), torch.tensor([0.7], device=device)
    out = res.clone()
    part = torch.full((3, d), float("nan"), device=device)  # scratch: every value written before it is read
    experts_down_gemv(act, down.data, dt, ids, w, out, out, shared=shared, shared_logit=slog, tile=tile,
                      part=part)  # in place
    want = experts_down_gemv_naive(act, down.data, dt, ids, w, res, shared=shared, shared_logit=slog)
    assert torch.allclose(out, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_split_down_launch_is_the_fused_sum_bit_for_bit(device):
    """The split launch adds the slots' shares in the fused kernel's order: the same fp32 sum, not a near one."""
    d, ff = 256, 256
    down = _stack(GGMLType.Q4_K, E, d, ff, device, 3)
    g = torch.Generator().manual_seed(5)
    act = torch.randn(4, ff, generator=g).to(device)
    ids = torch.tensor([6, 1, 3, 0], dtype=torch.int32, device=device)
    w = torch.tensor([0.4, 0.3, 0.2, 0.1], device=device)
    res = torch.randn(d, generator=g).to(device)
    fused, split = res.clone(), res.clone()
    experts_down_gemv(act, down.data, GGMLType.Q4_K, ids, w, res, fused, tile=ExpertTile(16, 16))
    experts_down_gemv(act, down.data, GGMLType.Q4_K, ids, w, res, split, tile=ExpertTile(16, 16, split_down=True),
                      part=torch.empty(4, d, device=device))
    assert torch.equal(fused, split)
    with pytest.raises(ValueError, match="needs part"):
        experts_down_gemv(act, down.data, GGMLType.Q4_K, ids, w, res, split, tile=ExpertTile(split_down=True))
    with pytest.raises(ValueError, match="powers of two"):
        ExpertTile(24)
    assert ExpertTile.parse("s16d8w2split") == ExpertTile(16, 8, True, 2)


def test_decode_gemv_reads_only_the_chosen_experts(device):
    """Poison every expert not chosen with NaN: the result must stay finite."""
    gate = _stack(GGMLType.F32, E, FF, D, device, 1)
    up = _stack(GGMLType.F32, E, FF, D, device, 2)
    for w in (gate, up):
        w.data.view(E, FF, D)[[1, 2, 4, 5, 6]] = float("nan")
    ids = torch.tensor([3, 7, 0], dtype=torch.int32, device=device)
    act = torch.empty(3, FF, device=device)
    experts_swiglu_gemv(torch.randn(D, device=device), torch.ones(D, device=device), 1e-6,
                        gate.data, GGMLType.F32, up.data, GGMLType.F32, ids, FF, act)
    assert torch.isfinite(act).all()


def test_sort_by_expert_groups_and_pads(device):
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], dtype=torch.int32, device=device)
    s = sort_by_expert(ids, 4, 4)
    rows = s.slot_of_row.cpu().tolist()
    tiles = s.tile_expert.cpu().tolist()
    assert rows[:4] == [1, 4, -1, -1] and rows[4:8] == [3, -1, -1, -1] and rows[8:12] == [0, 2, 5, -1]
    assert tiles[:3] == [0, 1, 2] and all(t == 4 for t in tiles[3:])  # expert 3 has no tile
    assert len(rows) == 4 * -(-(6 + 4 * 3) // 4)


@pytest.mark.parametrize("gt, dt, tile", [(GGMLType.Q4_K, GGMLType.Q6_K, None), (GGMLType.BF16, GGMLType.Q8_0, None),
                                          (GGMLType.Q4_K, GGMLType.Q6_K, GroupedTile(32, 32, 1))])
def test_grouped_prefill_matches_twin(device, gt, dt, tile):
    d, ff, t, k = 256, 256, 21, 3
    gate, up = _stack(gt, E, ff, d, device, 5), _stack(gt, E, ff, d, device, 6)
    down = _stack(dt, E, d, ff, device, 7)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(t, d, generator=g).to(device).to(torch.bfloat16)
    logits = torch.randn(t, E, generator=g).to(device)
    logits[:, 2] += 3  # one hot expert: a group longer than one row tile
    ids, w = moe_route(logits, k)
    got = grouped_experts(x, ids, w, gate.data, gt, up.data, gt, down.data, dt, E, ff, tile=tile)
    want = grouped_experts_naive(x, ids, w, gate.data, gt, up.data, gt, down.data, dt, ff)
    rel = (got - want).norm() / want.norm()
    assert rel < 2e-2, rel  # bf16 operands in the dots, fp32 accumulation
    assert rel > 0 or device == "cpu"


def test_grouped_tiles_are_checked_and_parsed(device):
    assert GroupedTile.parse("bm16bn64w4") == GroupedTile(16, 64, 4)
    for bad in (lambda: GroupedTile(8), lambda: GroupedTile(48), lambda: GroupedTile.parse("16x64")):
        with pytest.raises(ValueError):
            bad()
    ids = torch.zeros(2, 1, dtype=torch.int32, device=device)
    x = torch.zeros(2, 256, device=device)
    gate = _stack(GGMLType.Q4_K, E, 256, 256, device, 1)
    with pytest.raises(ValueError, match="padded to 16 rows"):  # a sort made for another tile is refused
        grouped_experts(x, ids, torch.ones(2, 1, device=device), gate.data, GGMLType.Q4_K, gate.data, GGMLType.Q4_K,
                        gate.data, GGMLType.Q4_K, E, 256, sort=sort_by_expert(ids, E, 16), tile=GroupedTile(32, 64))


def test_grouped_tiles_past_the_last_group_dequantize_nothing(monkeypatch):
    """The grid is a static bound (no host sync), so up to E tiles a layer have no expert; they must leave at once,
    not run their K loop on masked loads (the dequantization is the prefill's cost). Counted in the interpreter."""
    from runtime.kernels.moe_experts import kernel

    if not kernel.interpreting():
        pytest.skip("counts the interpreter's calls")
    calls = []
    real = kernel.dequant_pair
    monkeypatch.setattr(kernel, "dequant_pair", lambda *a: calls.append(1) or real(*a))
    d = ff = 256
    gate, down = _stack(GGMLType.Q4_K, E, ff, d, "cpu", 1), _stack(GGMLType.Q4_K, E, d, ff, "cpu", 2)
    ids, w = moe_route(torch.randn(5, E, generator=torch.Generator().manual_seed(3)), 2)
    tile = GroupedTile(16, 64, 1)
    sort = sort_by_expert(ids, E, tile.bm)
    grouped_experts(torch.randn(5, d), ids, w, gate.data, GGMLType.Q4_K, gate.data, GGMLType.Q4_K, down.data,
                    GGMLType.Q4_K, E, ff, sort=sort, tile=tile)
    busy = int((sort.tile_expert < E).sum())
    assert busy < sort.tile_expert.numel()  # the case under test: the grid has idle tiles
    steps = (ff // tile.bn) * (d // 64)  # column tiles x K steps of one tile, per matrix
    assert len(calls) == busy * steps * 3  # gate and up, then down: each busy tile's own, nothing for the rest
