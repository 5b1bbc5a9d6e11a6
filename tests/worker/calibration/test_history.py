"""A/A history: keyed by the GPU/driver/torch/triton (not the hostname), expired, drift-tested."""
import socket
import time

import numpy as np

from worker.calibration.aa_store import AAStore
from worker.calibration.history import current_null
from worker.calibration.key import calibration_key, key_facts
from worker.config import EvalSettings

S = EvalSettings()
ARGS = ("k", "quick", "proto", "m", "decode@128")


def _fill(store, deltas, start):
    for i, d in enumerate(deltas):
        store.add_pair_delta_at(*ARGS, d, created=start + i)


def _null(store, now=None):
    return current_null(store, *ARGS, S, per_gate_rate=1e-3, max_pairs=4, now=now)


def test_key_is_the_hardware_and_software_not_the_hostname(monkeypatch):
    facts = key_facts("cpu")
    k1 = calibration_key("cpu", facts)
    monkeypatch.setattr(socket, "gethostname", lambda: "a-recreated-container")
    assert calibration_key("cpu", key_facts("cpu")) == k1 and "a-recreated-container" not in k1
    gpu = dict(kind="cuda", gpu_uuid="GPU-1", driver="570.1", torch="2.13", triton="3.5", gpu_name="H200")
    assert calibration_key("cuda", gpu) != calibration_key("cuda", {**gpu, "driver": "575.0"})
    assert calibration_key("cuda", gpu) != calibration_key("cuda", {**gpu, "gpu_uuid": "GPU-2"})
    assert calibration_key("cuda", gpu) != calibration_key("cuda", {**gpu, "triton": "3.6"})


def test_stale_history_expires(tmp_path):
    store = AAStore(tmp_path / "aa.sqlite")
    now = time.time()
    _fill(store, list(np.random.default_rng(0).normal(0, 0.003, 40)), now - 40 * 86400)
    assert not _null(store, now).calibrated  # 40 days old > aa_max_age_days
    _fill(store, list(np.random.default_rng(1).normal(0, 0.003, 40)), now - 1000)
    assert _null(store, now).calibrated and _null(store, now).aa_deltas == 40


def test_drift_rebuilds_the_floor_and_says_so(tmp_path):
    store = AAStore(tmp_path / "aa.sqlite")
    rng = np.random.default_rng(2)
    now = time.time()
    _fill(store, list(rng.normal(0, 0.002, 60)), now - 5000)
    assert _null(store, now).calibrated
    _fill(store, list(rng.normal(0, 0.02, S.drift_window)), now - 100)  # the host got 10x noisier
    n = _null(store, now)
    assert not n.calibrated and n.state == "drift" and "A/A noise changed" in n.reason
    again = _null(store, now)  # the old history is retired; still uncalibrated until rebuilt
    assert not again.calibrated and again.aa_deltas == S.drift_window and "rebuilt" in again.reason


def test_same_noise_is_not_drift(tmp_path):
    store = AAStore(tmp_path / "aa.sqlite")
    now = time.time()
    _fill(store, list(np.random.default_rng(4).normal(0, 0.003, 80)), now - 5000)
    assert _null(store, now).calibrated


def test_a_host_noisier_on_every_gate_is_caught_by_the_pooled_test(tmp_path):
    """1.6x noisier on all six gates: too little per gate (8 pairs), plain when pooled over the gates."""
    from worker.calibration.history import drift_p

    store = AAStore(tmp_path / "aa.sqlite")
    rng = np.random.default_rng(11)
    now = time.time()
    gates = [f"decode@{c}" for c in (128, 512, 4096)] + ["prefill@512", "prefill@4096", "decode@64"]
    per_gate = []
    for g in gates:
        old, new = list(rng.normal(0, 0.003, 40)), list(rng.normal(0, 0.0048, S.drift_window))
        per_gate.append(drift_p(new, old))
        for i, d in enumerate(old + new):
            store.add_pair_delta_at("k", "quick", "proto", "m", g, d, created=now - 5000 + i)
    n = current_null(store, "k", "quick", "proto", "m", "decode@128", S, per_gate_rate=1e-3, max_pairs=4, now=now)
    assert sum(p < S.drift_alpha for p in per_gate) < len(gates)  # the per-gate tests alone miss some gates
    assert not n.calibrated and n.state == "drift", n
