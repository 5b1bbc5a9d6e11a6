"""The GPU end-to-end receipt's gate rows (bench/worker/gpu_e2e.py) carry each gate's memory gate: the pipeline keeps
the peaks per model (`models.<model>.gate_memory`), and the rows of gpu-e2e-h100-20261206T192305Z.json read them
from the gate results, where they never are, so every measured peak showed as null."""
import pytest

from bench.worker.gpu_e2e import gate_row

from tests.worker.helpers import eval_fakes


@pytest.mark.sandbox
@pytest.mark.timed
def test_each_gate_row_carries_its_memory_gate_from_a_real_receipt(tmp_path):
    res = eval_fakes(tmp_path).to_dict()
    rows = [gate_row(g, res["receipt"]) for g in res["gates"]]
    assert rows and all(r["memory_reason"] == "CPU evaluation" and r["base_peak_gpu_bytes"] is None for r in rows)
    model, gate = rows[0]["model"], rows[0]["gate"]
    res["receipt"]["models"][model]["gate_memory"][gate].update(  # as NVML reports them on a GPU
        base_peak_gpu_bytes=9 << 30, head_peak_gpu_bytes=11 << 30, regression=True, reason=None)
    row = gate_row(res["gates"][0], res["receipt"])
    assert (row["base_peak_gpu_bytes"], row["head_peak_gpu_bytes"], row["memory_regression"]) == (9 << 30, 11 << 30, True)
    assert row["rel_change"] == res["gates"][0]["rel_change"]
