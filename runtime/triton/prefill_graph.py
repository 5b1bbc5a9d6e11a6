"""CUDA-graph replay of a whole one-chunk prefill of a fixed length at a fixed start position.

Why: below ~1k tokens the 0.8B prefill is bound by the host, not the GPU — pp512 took as long as
pp1024 on the H200 (31 ms, bench/receipts/prefill-0.8b_4b_9b-20261203T115558Z.json), and the GPU
was busy 12.7 of 18.5 ms on another box (prefill-profile-0.8b-q4_k_m-512-20261202T175958Z.json,
394 launches, each paying Triton's Python launch cost). A replayed graph pays none of it. The
same lengths recur in practice (a gate times one context again and again), so the first prefill
of a (length, start) pair runs eagerly (compiling every kernel, which a capture cannot) and is then
captured in the same call: the second one already replays, so one warm-up round is enough for a
gate. Measured on the H200 (prefill-0.8b-20261203T202414Z.json, prefill-4b-20261203T202547Z.json,
prefill-9b-20261203T202455Z.json): logits equal to eager (max |diff| 0 at 512/1024/4096), pp512
13.9k -> 77.1k tok/s (0.8B), 17.8k -> 28.0k (4B), 12.2k -> 19.5k (9B); pp4096 +1-6 %; peak memory
+32 MiB at most. On by default; TOKENGATE_PREFILL_GRAPHS=0 turns it off.
Only a single-chunk, last-position prefill of a dense model (the MoE's when its engine asks) is replayed;
anything else (all logits, several chunks, the debug probes) runs eagerly as before. The graph reads the
engine's state tensors in place (reset() zeroes them without reallocating), the prefill
workspace and a static ids buffer, and writes a static logits row the caller copies.
"""
from __future__ import annotations

import os
from collections import OrderedDict

import torch



def enabled_by(environ=os.environ) -> bool:
    """Graphs unless TOKENGATE_PREFILL_GRAPHS=0."""
    return environ.get("TOKENGATE_PREFILL_GRAPHS", "1") != "0"


ENABLED = enabled_by()
MAX_GRAPHS = 8  # (length, start) pairs kept; the least recently used is dropped
MIN_TOKENS = 64  # shorter prompts gain little and would multiply the graphs kept


# The MoE's prefill has no host read left (its expert sort used torch.bincount, which had one). Replayed on an H100,
# 35B-A3B pp512 5937 -> 7718 and 7676 tok/s (llama.cpp 5423 / 5425 in the same calls), pp4096 18 021 -> 18 402, logits
# equal to eager's (max rel 0): moe-35b-a3b-variants-h100-20261206T051139Z.json, ...T051759Z.json. An engine may
# still opt out (moe_prefill_graphs = False).
MOE_ENABLED = True


def graphable(engine, n: int, chunk: int, all_logits: bool) -> bool:
    moe_ok = not engine.config.is_moe or getattr(engine, "moe_prefill_graphs", MOE_ENABLED)
    return (getattr(engine, "prefill_graphs_enabled", ENABLED) and torch.device(engine.device).type == "cuda"
            and not all_logits and MIN_TOKENS <= n <= chunk and moe_ok
            and not getattr(engine, "prefill_debug", False))


class _Captured:
    def __init__(self, ids: torch.Tensor, out: torch.Tensor, graph: torch.cuda.CUDAGraph, buffers: tuple):
        self.ids, self.out, self.graph = ids, out, graph
        self.buffers = buffers  # what the graph's kernels address: replaying after any moved is a use-after-free


def _buffers(engine, ws) -> tuple:
    return ws, getattr(engine, "prefill_matrix_scratch", None)


class PrefillGraphs:
    """Per engine: the captured graph of each (length, start, GEMM mode) key, least recently used first."""

    def __init__(self):
        self.graphs: OrderedDict[tuple, _Captured | None] = OrderedDict()  # None: capture failed

    def run(self, engine, ids: torch.Tensor, pos0: int, ws, eager) -> torch.Tensor:
        """Logits [V] of prefilling `ids` at `pos0`: eagerly (`eager()`) the first time, then by replay."""
        from .prefill import gemm_mode  # another GEMM path is another graph

        # the MoE's grouped-GEMM tile is another graph too
        key = (int(ids.shape[0]), int(pos0), gemm_mode(engine), getattr(engine, "grouped_tile", None))
        if key not in self.graphs:  # eager first: it compiles every kernel (capture cannot), then capture
            out = eager()
            self._keep(key, self._capture(engine, key, ws))
            return out
        cap = self.graphs[key]
        if cap is not None and any(a is not b for a, b in zip(cap.buffers, _buffers(engine, ws))):
            cap = self._keep(key, self._capture(engine, key, ws))  # replaying would address freed memory
        if cap is None:
            return eager()
        self.graphs.move_to_end(key)
        cap.ids.copy_(ids)
        cap.graph.replay()
        return cap.out[0].clone()  # the static row is overwritten by the next replay

    def _keep(self, key: tuple, cap: _Captured | None) -> _Captured | None:
        self.graphs[key] = cap
        self.graphs.move_to_end(key)
        while len(self.graphs) > MAX_GRAPHS:
            self.graphs.popitem(last=False)
        return cap

    @staticmethod
    def _capture(engine, key: tuple, ws) -> _Captured | None:
        from .prefill import _forward_chunk, _logits  # this module is imported by prefill.py

        n, pos0 = key[:2]
        ids = torch.zeros(n, dtype=torch.int32, device=engine.device)
        out = torch.empty(1, engine.config.vocab_size, dtype=torch.float32, device=engine.device)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(engine.device)
        try:  # capturing runs nothing: the state is untouched until the replay
            with torch.cuda.graph(graph):
                _forward_chunk(engine, ids, ws, pos0)
                _logits(engine, ws, slice(n - 1, n), out)
        except RuntimeError:  # something in the path synchronises: stay eager for this key
            torch.cuda.synchronize(engine.device)
            return None
        return _Captured(ids, out, graph, _buffers(engine, ws))
