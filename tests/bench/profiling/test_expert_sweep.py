"""bench/profiling/expert_sweep.py on the CPU (interpreter, tiny shape): every tile is checked against the twins
before it could be timed, a wrong kernel is recorded as failing (exit 3) and never timed, a bad tile name fails
before any setup, and a CPU run says why it has no times instead of writing 0."""
import json
import os

if not os.environ.get("TRITON_INTERPRET"):
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

import pytest  # noqa: E402

from bench.profiling import expert_sweep  # noqa: E402


def run(tmp_path, tiles):
    code = expert_sweep.main(["--device", "cpu", "--shape", "tiny", "--layers", "2", "--tiles", tiles,
                              "--out", str(tmp_path)])
    (path,) = tmp_path.glob("expert-sweep-tiny-*.json")
    return code, json.loads(path.read_text())


def test_tiles_are_checked_and_a_cpu_run_has_no_times(tmp_path):
    code, r = run(tmp_path, "s16d16w4split,s16d16w4split-x8")
    assert code == 0
    for name in ("s16d16w4split", "s16d16w4split-x8"):
        t = r["tiles"][name]
        assert t["check"]["pass"] and t["timing"] is None and "CPU" in t["timing_reason"]
    assert r["tiles"]["s16d16w4split-x8"]["check"]["pass_int8_exact"]
    assert r["fastest"] is None and r["bytes_per_layer"]["swiglu"] == 2 * 3 * 256 * 2 * 144
    assert [w["pass"] and w["timing"] is None for w in r["route"].values()] == [True] * 3  # w1, w2, w4


def test_a_route_launch_that_differs_from_its_twin_is_not_timed(tmp_path, monkeypatch):
    from runtime.kernels import moe_route

    real = moe_route.moe_route

    def reversed_ids(logits, k, *, ids, weights, num_warps):  # ties or order broken at one warp count
        real(logits, k, ids=ids, weights=weights, num_warps=num_warps)
        if num_warps == 1:
            ids.copy_(ids.flip(-1))

    monkeypatch.setattr(moe_route, "moe_route", reversed_ids)
    _, r = run(tmp_path, "s16d16w4split")
    assert not r["route"]["w1"]["pass"] and "differ" in r["route"]["w1"]["timing_reason"]
    assert r["route"]["w2"]["pass"] and r["route"]["w4"]["pass"]


def test_a_wrong_kernel_is_recorded_failing_and_never_timed(tmp_path, monkeypatch):
    from runtime.kernels.moe_experts import gemv_path

    real = gemv_path.swiglu

    def off_by_one_slot(*a, **k):  # what a slot-offset bug looks like: slot 0's rows written for every slot
        out = real(*a, **k)
        out[1:] = out[0]
        return out

    monkeypatch.setattr(gemv_path, "swiglu", off_by_one_slot)
    code, r = run(tmp_path, "s16d16w4split-words")
    t = r["tiles"]["s16d16w4split-words"]
    assert code == 3 and not t["check"]["pass"] and "swiglu" not in t


def test_a_bad_tile_name_fails_before_any_setup(tmp_path):
    with pytest.raises(ValueError, match="expert tile"):
        expert_sweep.main(["--device", "cpu", "--shape", "tiny", "--tiles", "s16d16w4-fast", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
