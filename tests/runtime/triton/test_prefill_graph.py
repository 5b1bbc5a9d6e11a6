"""Bookkeeping of the prefill CUDA graphs (runtime/triton/prefill_graph.py), with capture faked: CI has
no GPU. What must hold: the first sighting of a (length, start) runs eagerly (it compiles the kernels
a capture cannot) and captures after, so the second one already replays (a gate warms up once); a
graph whose buffers moved is captured again (replaying it
would address freed memory); a capture that fails stays eager; only so many graphs are kept; and
nothing but a one-chunk, last-position CUDA prefill (dense, or a MoE whose engine asks) is ever a candidate."""
from types import SimpleNamespace

import pytest
import torch

from runtime.triton import prefill_graph as pg
from runtime.triton.prefill_graph import PrefillGraphs


class FakeGraph:
    def __init__(self, out):
        self.out, self.replays = out, 0

    def replay(self):
        self.replays += 1


@pytest.fixture
def fake_capture(monkeypatch):
    made = []

    def capture(engine, key, ws):
        if engine.fail:
            return None
        n = key[0]
        out = torch.full((1, 4), float(len(made) + 1))
        cap = pg._Captured(torch.zeros(n, dtype=torch.int32), out, FakeGraph(out), pg._buffers(engine, ws))
        made.append((key, cap))
        return cap

    monkeypatch.setattr(PrefillGraphs, "_capture", staticmethod(capture))
    return made


def _engine(fail=False, gemm="auto"):
    return SimpleNamespace(fail=fail, prefill_matrix_scratch=None, prefill_gemm=gemm)


def test_first_sighting_is_eager_then_captured_and_the_next_replays(fake_capture):
    g, eng, ws = PrefillGraphs(), _engine(), object()
    eager_calls = []

    def eager():
        eager_calls.append(1)
        return torch.zeros(4)

    ids = torch.arange(8, dtype=torch.int32)
    first = g.run(eng, ids, 0, ws, eager)
    assert eager_calls == [1] and len(fake_capture) == 1 and torch.equal(first, torch.zeros(4))
    cap = fake_capture[0][1]
    assert cap.graph.replays == 0  # the first call's answer is the eager one
    out = g.run(eng, ids, 0, ws, eager)
    assert eager_calls == [1] and len(fake_capture) == 1
    assert cap.graph.replays == 1 and torch.equal(cap.ids, ids) and torch.equal(out, torch.ones(4))
    out[0] = 99.0  # the caller's copy, not the static row the next replay overwrites
    assert cap.out[0, 0] == 1.0
    g.run(eng, ids, 0, ws, eager)
    assert len(fake_capture) == 1 and cap.graph.replays == 2
    g.run(eng, ids, 5, ws, eager)  # another start position is another graph: eager first
    assert eager_calls == [1, 1] and len(fake_capture) == 2


def test_moved_buffers_are_captured_again(fake_capture):
    g, eng = PrefillGraphs(), _engine()
    ids = torch.arange(8, dtype=torch.int32)
    ws1, ws2 = object(), object()
    g.run(eng, ids, 0, ws1, lambda: torch.zeros(4))
    g.run(eng, ids, 0, ws1, lambda: torch.zeros(4))
    g.run(eng, ids, 0, ws2, lambda: torch.zeros(4))  # a new workspace: the old graph addresses freed memory
    assert len(fake_capture) == 2 and fake_capture[1][1].buffers[0] is ws2
    eng.prefill_matrix_scratch = object()
    g.run(eng, ids, 0, ws2, lambda: torch.zeros(4))
    assert len(fake_capture) == 3


def test_a_failed_capture_stays_eager(fake_capture):
    g, eng, ws = PrefillGraphs(), _engine(fail=True), object()
    calls = []
    ids = torch.arange(8, dtype=torch.int32)
    for _ in range(3):
        g.run(eng, ids, 0, ws, lambda: calls.append(1) or torch.zeros(4))
    assert len(calls) == 3 and g.graphs[(8, 0, "auto", None)] is None


def test_only_so_many_graphs_are_kept(fake_capture):
    g, eng, ws = PrefillGraphs(), _engine(), object()
    for n in range(pg.MAX_GRAPHS + 3):
        ids = torch.arange(64 + n, dtype=torch.int32)
        g.run(eng, ids, 0, ws, lambda: torch.zeros(4))
        g.run(eng, ids, 0, ws, lambda: torch.zeros(4))
    assert len(g.graphs) == pg.MAX_GRAPHS and (64, 0, "auto", None) not in g.graphs  # the least recently used went


def test_another_gemm_mode_is_another_graph(fake_capture):
    """A graph captured on one GEMM path replayed under another's label would time the wrong kernels."""
    g, eng, ws = PrefillGraphs(), _engine(gemm="scratch"), object()
    ids = torch.arange(8, dtype=torch.int32)
    g.run(eng, ids, 0, ws, lambda: torch.zeros(4))
    g.run(eng, ids, 0, ws, lambda: torch.zeros(4))
    eng.prefill_gemm = "tile"
    eager = []
    g.run(eng, ids, 0, ws, lambda: eager.append(1) or torch.zeros(4))
    assert eager == [1] and [k for k, _ in fake_capture] == [(8, 0, "scratch", None), (8, 0, "tile", None)]


def test_another_grouped_tile_is_another_graph(fake_capture):
    """The MoE prefill's grouped-GEMM tile is part of the graph: a bench switching tiles must not replay the old."""
    g, eng, ws = PrefillGraphs(), _engine(), object()
    ids = torch.arange(8, dtype=torch.int32)
    g.run(eng, ids, 0, ws, lambda: torch.zeros(4))
    eng.grouped_tile = "bm16bn64w4"
    eager = []
    g.run(eng, ids, 0, ws, lambda: eager.append(1) or torch.zeros(4))
    assert eager == [1] and [k[3] for k, _ in fake_capture] == [None, "bm16bn64w4"]


def _cfg(moe=False):
    return SimpleNamespace(is_moe=moe)


@pytest.mark.parametrize("kw,ok", [
    ({}, True),
    ({"device": "cpu"}, False),
    ({"all_logits": True}, False),
    ({"n": 16}, False),            # too short to be worth a graph
    ({"n": 5000}, False),          # more than one chunk
    ({"moe": True}, True),         # the MoE too (measured on an H100, 2026-12-06: prefill_graph.MOE_ENABLED)
    ({"moe": True, "moe_graphs": False}, False),  # unless its engine opts out
    ({"moe": True, "moe_graphs": True}, True),
    ({"debug": True}, False),
    ({"enabled": False}, False),
])
def test_only_a_one_chunk_last_position_cuda_prefill_is_graphed(kw, ok):
    eng = SimpleNamespace(device=kw.get("device", "cuda"), config=_cfg(kw.get("moe", False)),
                          prefill_debug=kw.get("debug", False), prefill_graphs_enabled=kw.get("enabled", True))
    if "moe_graphs" in kw:
        eng.moe_prefill_graphs = kw["moe_graphs"]
    assert pg.graphable(eng, kw.get("n", 512), 4096, kw.get("all_logits", False)) is ok


def test_on_unless_turned_off():
    import os

    eng = SimpleNamespace(device="cuda", config=_cfg(), prefill_debug=False)
    assert pg.graphable(eng, 512, 4096, False) is pg.ENABLED
    assert pg.ENABLED is pg.enabled_by(os.environ)
    assert pg.enabled_by({}) is True and pg.enabled_by({"TOKENGATE_PREFILL_GRAPHS": "1"}) is True
    assert pg.enabled_by({"TOKENGATE_PREFILL_GRAPHS": "0"}) is False
