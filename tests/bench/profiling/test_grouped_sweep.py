"""bench/profiling/grouped_sweep.py on the CPU (interpreter, tiny shape): each grouped-GEMM tile is checked against
the torch twin before it could be timed, a wrong kernel is recorded as failing (exit 3) and never timed, a bad tile
name fails before any setup, and a CPU run says why it has no times instead of writing 0."""
import json
import os

if not os.environ.get("TRITON_INTERPRET"):
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

import pytest  # noqa: E402

from bench.profiling import grouped_sweep  # noqa: E402


def run(tmp_path, tiles):
    code = grouped_sweep.main(["--device", "cpu", "--shape", "tiny", "--layers", "1", "--tokens", "12",
                               "--tiles", tiles, "--out", str(tmp_path)])
    (path,) = tmp_path.glob("grouped-sweep-tiny-*.json")
    return code, json.loads(path.read_text())


def test_tiles_are_checked_and_a_cpu_run_has_no_times(tmp_path):
    code, r = run(tmp_path, "bm16bn256w1")
    assert code == 0
    for t in r["tiles"].values():
        assert t["check"]["pass"] and t["timing"] is None and "CPU" in t["timing_reason"]
    assert r["fastest_t12"] is None and r["weights_per_layer"] == 3 * 8 * 256 * 512
    assert 1 <= r["experts_with_tokens"]["12"] <= 8


def test_weights_dequantized_count_each_expert_once_a_tile_of_its_tokens():
    import torch

    ids = torch.tensor([[0, 1], [0, 2], [0, 1]])  # expert 0: 3 tokens, 1: 2, 2: 1, 3: none
    per = 3 * 4 * 8  # gate, up, down of one expert at ff 4, d 8
    assert grouped_sweep.dequantized_weights({"experts": 4, "ff": 4, "d": 8}, ids, 2) == (2 + 1 + 1) * per
    assert grouped_sweep.dequantized_weights({"experts": 4, "ff": 4, "d": 8}, ids, 16) == 3 * per


def test_a_wrong_kernel_is_recorded_failing_and_never_timed(tmp_path, monkeypatch):
    from runtime.kernels import moe_experts

    real = moe_experts.grouped_experts

    def drops_the_last_choice(x, ids, w, *a, **k):  # what a slot bug looks like: one routed expert left out
        return real(x, ids, w * (torch.arange(ids.shape[1]) < ids.shape[1] - 1), *a, **k)

    import torch

    monkeypatch.setattr(moe_experts, "grouped_experts", drops_the_last_choice)
    code, r = run(tmp_path, "bm16bn256w1")
    t = r["tiles"]["bm16bn256w1"]
    assert code == 3 and not t["check"]["pass"] and t["check"]["rel"] > 0.1 and "t12" not in t


def test_skewed_routes_make_some_experts_hot():
    ids, w = grouped_sweep.routes({"experts": 256, "k": 8}, 512, "cpu")
    counts = torch_counts(ids, 256)
    assert ids.shape == (512, 8) and bool((w.sum(-1) - 1).abs().max() < 1e-5)
    assert counts.max() > 4 * counts.float().mean()  # hot experts, as a trained router's (uniform: ~1.5x)


def torch_counts(ids, e):
    import torch

    return torch.bincount(ids.reshape(-1).long(), minlength=e)


def test_a_bad_tile_name_fails_before_any_setup(tmp_path):
    with pytest.raises(ValueError, match="grouped tile"):
        grouped_sweep.main(["--device", "cpu", "--shape", "tiny", "--tiles", "bm64-fast", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_the_rate_is_billions_of_weights_a_millisecond():
    # the first GPU run printed 0.00: the formula divided by 1e6 too much (its receipts were recomputed off the box)
    assert grouped_sweep.g_per_ms(758_000_000, 1232.0) == pytest.approx(0.615, rel=1e-3)
