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


def _log(path, *rows):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_upkeep_after_a_verdict_is_timed_from_its_done_to_the_upkeeps(tmp_path):
    """The A/A sentinel pairs run after the verdict (worker/calibration/sentinel.py): the case waits for them, so the
    next case starts on an idle worker, and their time is reported beside the verdict's, not inside it."""
    from bench.worker.gpu_e2e import upkeep_log

    e = "e2e-aa-1"
    _log(tmp_path / "phases.jsonl", {"eval_id": e, "phase": "verify", "t": 10.0}, {"eval_id": e, "phase": "done", "t": 20.0},
         {"eval_id": f"{e}-confirm", "phase": "done", "t": 21.0},  # another run's end is not this upkeep's
         {"eval_id": e, "phase": "sentinel", "model": "m9", "t": 22.0},
         {"eval_id": e, "phase": "sentinel", "model": "m08", "t": 60.0}, {"eval_id": e, "phase": "done", "t": 70.0})
    got = upkeep_log(tmp_path, e, timeout=5)
    assert got["seconds"] == 50.0 and [(p["model"], p["seconds"]) for p in got["phases"]] == [("m9", 38.0), ("m08", 10.0)]
    _log(tmp_path / "phases.jsonl", {"eval_id": e, "phase": "done", "t": 20.0}, {"eval_id": e, "phase": "sentinel", "t": 22.0})
    cut = upkeep_log(tmp_path, e, timeout=0.2, poll=0.05)
    assert cut["seconds"] is None and "did not end" in cut["reason"] and len(cut["phases"]) == 1


def test_an_infra_verdict_is_not_waited_on_for_upkeep():
    """An INFRA verdict's owed pairs are dropped, so no upkeep ends in the phases log: waiting would spend the call."""
    from bench.worker.gpu_e2e import owes_upkeep

    owed = {"receipt": {"models": {"m": {"sentinel_aa_pair": {"recorded": None}}, "g": {}}}}
    assert owes_upkeep({**owed, "verdict": "none"}) and not owes_upkeep({**owed, "verdict": "INFRA"})
    assert not owes_upkeep({"verdict": "none", "receipt": {"models": {"m": {}}}})  # sentinel off: nothing owed
