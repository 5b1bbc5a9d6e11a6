"""bench/runtime/moe.py's file handling, which `pending.sh moe` relies on: the file is made while llama-bench builds
(--synth-only) and the timed run then reads that very file (--reuse, its sha256 read from it, never made again);
a dense shape is refused before minutes of synthesis. The kernels and the timing themselves run on the device."""
import json

import pytest

from bench.runtime import moe


def receipt(out):
    (path,) = sorted(out.glob("moe-*.json"))[-1:]
    return json.loads(path.read_text())


def test_the_timed_run_reads_the_file_made_while_llama_bench_built(tmp_path):
    made, timed = tmp_path / "made", tmp_path / "timed"
    assert moe.main(["--shape", "tiny-moe", "--device", "cpu", "--synth-only", "--work", str(tmp_path),
                     "--out", str(made)]) == 0
    synth = receipt(made)["synth"]
    before = (tmp_path / "qwen35moe-tiny-moe-q4_k_m-seed0.gguf").stat().st_mtime_ns
    assert moe.main(["--shape", "tiny-moe", "--device", "cpu", "--synth-only", "--reuse", "--work", str(tmp_path),
                     "--out", str(timed)]) == 0
    r = receipt(timed)
    assert "synth" not in r and r["reused"]["gguf_sha256"] == synth["gguf_sha256"]
    assert (tmp_path / "qwen35moe-tiny-moe-q4_k_m-seed0.gguf").stat().st_mtime_ns == before


def test_a_dense_shape_is_refused_before_any_synthesis(tmp_path):
    with pytest.raises(SystemExit):
        moe.main(["--shape", "tiny", "--device", "cpu", "--work", str(tmp_path), "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_a_swept_table_gives_each_swept_launch_shape_its_own_tile_and_leaves_the_rest(tmp_path):
    from types import SimpleNamespace

    from runtime.kernels.gemv import GemvConfig
    from runtime.kernels.gemv.kernel import TileTable

    key = "Q6_K:8192x2048"
    sweep = tmp_path / "gemv-sweep-qwen35moe.json"
    sweep.write_text(json.dumps({"table": {key: {"block_n": 4, "block_b": 2, "num_warps": 1, "x8": True}}}))
    table, tiled = moe.swept_table(SimpleNamespace(device="cpu"), sweep)
    assert tiled == [key] and isinstance(table, TileTable)
    assert table._by_key[key] == GemvConfig(4, 2, 1, x8=True)
    assert table._by_key.get("Q4_K:4096x2048") is None  # an unswept shape keeps the fallback


def test_a_default_expert_part_is_the_engines_default_tile():
    # session 21: "+default" timed ExpertTile()'s fused launch as if it were the engine's split default
    from runtime.kernels.moe_experts import DEFAULT_EXPERT_TILE, ExpertTile

    assert moe.expert_tile("default") == moe.expert_tile("") == DEFAULT_EXPERT_TILE
    assert moe.expert_tile("s16d32w4split") == ExpertTile(16, 32, True, 4)


class FakeEngine:
    """Records which grouped tile each prefill ran with; logits differ by tile so the comparison is visible."""

    def __init__(self, fail_at=None):
        from types import SimpleNamespace

        import torch

        self.config, self.grouped_tile, self.ran, self.fail_at, self.torch = SimpleNamespace(vocab_size=50), None, [], \
            fail_at, torch

    def reset(self):
        pass

    def synchronize(self):
        pass

    stale_graph = False  # a graph that replays the prompt it captured, whatever it is given

    def prefill(self, ids):
        graphed = getattr(self, "moe_prefill_graphs", False)
        self.ran.append((len(ids), self.grouped_tile, graphed))
        if self.fail_at is not None and len(self.ran) == self.fail_at:
            raise RuntimeError("out of resources")
        if graphed and self.stale_graph:
            self.captured = getattr(self, "captured", ids)
            ids = self.captured
        logits = self.torch.zeros(50)
        logits[int(ids.sum()) % 50] = 1.0 + (0.01 if self.grouped_tile else 0.0)  # the prompt's own answer
        return logits


def test_a_prefill_variant_is_compared_with_the_engines_own_and_never_left_behind():
    from runtime.kernels.moe_experts import GroupedTile

    eng = FakeEngine()
    out = moe.prefill_variant(eng, "graph+bm16bn64w4", [8, 16], runs=2)
    assert eng.ran[:2] == [(8, None, False)] * 2  # the references: eager, default tile, on two prompts
    assert all(t == GroupedTile(16, 64, 4) and g for _, t, g in eng.ran[2:])
    assert out["argmax_equal"] and 0 < out["logits_rel_vs_default"] < 0.02 and {"pp8", "pp16"} <= set(out)
    assert out["argmax_equal_other_prompt"] and out["logits_rel_vs_default_other_prompt"] < 0.02
    stale = FakeEngine()
    stale.stale_graph = True  # a replay that kept the captured prompt (its routing) is caught on the other prompt
    out = moe.prefill_variant(stale, "graph", [8], runs=1)
    assert out["argmax_equal"] and not out["argmax_equal_other_prompt"]
    assert eng.grouped_tile is None and not hasattr(eng, "moe_prefill_graphs")  # as it was: the engine's default
    failing = FakeEngine(fail_at=3)
    failing.moe_prefill_graphs = True  # an engine's own setting (the default since 2026-12-06) survives an error
    with pytest.raises(RuntimeError):
        moe.prefill_variant(failing, "bm32bn64w4", [8], runs=2)
    assert failing.grouped_tile is None and failing.moe_prefill_graphs is True  # for whatever the bench times next
    assert failing.ran[0] == (8, None, False)  # its reference is still eager
    for bad in ("16x64", "bm16bn64w4+bm32bn64w4"):
        with pytest.raises(ValueError, match="grouped tile"):
            moe.prefill_variant(FakeEngine(), bad, [8], runs=1)
