"""Pooling A/A histories of several GPU runs (other cards) into the placebo: by host, by profile and
protocol, oldest first; a model's gates grouped so each model is judged on its own pairs."""
import pytest

from bench.worker.gpu_calibration import by_model, pooled_deltas, pooled_pairs
from worker.calibration.aa_store import AAStore

NAMES = {"big decode@128": ("big", "decode@128", "p1"), "big prefill@4096": ("big", "prefill@4096", "p1"),
         "small decode@512": ("small", "decode@512", "p1")}


def test_pooled_deltas_keep_each_card_apart_and_match_profile_and_protocol(tmp_path):
    store = AAStore(tmp_path / "h.sqlite")
    for i, host in enumerate(["cuda/GPU-a/1", "cuda/GPU-b/2"]):
        for t in range(3):
            store.add_pair_delta_at(host, "standard", "p1", "big", "decode@128", 0.01 * (10 * i + t), created=100 + t)
    store.add_pair_delta_at("cuda/GPU-a/1", "standard", "p2", "big", "decode@128", 9.0, created=50)  # other protocol
    store.add_pair_delta_at("cuda/GPU-a/1", "quick", "p1", "big", "decode@128", 9.0, created=50)  # other profile
    store.add_pair_delta_at("cuda/GPU-a/1", "standard", "p1", "small", "decode@512", 0.5, created=60)

    got = pooled_deltas(store.path, "standard", NAMES)
    assert set(got) == {"cuda/GPU-a/1", "cuda/GPU-b/2"}
    assert got["cuda/GPU-a/1"]["big decode@128"] == [0.0, 0.01, 0.02]  # oldest first, no foreign rows
    assert got["cuda/GPU-b/2"]["big decode@128"] == [0.1, 0.11, 0.12]
    assert got["cuda/GPU-a/1"]["small decode@512"] == [0.5] and got["cuda/GPU-b/2"]["small decode@512"] == []
    only_b = pooled_deltas(store.path, "standard", NAMES, host="cuda/GPU-b/2")
    assert set(only_b) == {"cuda/GPU-b/2"}


def test_gates_are_grouped_by_model():
    assert by_model(NAMES) == {"big": ["big decode@128", "big prefill@4096"], "small": ["small decode@512"]}


def test_a_missing_history_is_named_and_not_created(tmp_path):
    # pending.sh once passed an unmatched glob: the report died on "no such table" after making an empty file
    missing = tmp_path / "aa-history-h100-*.sqlite"
    with pytest.raises(FileNotFoundError, match="no such file"):
        pooled_deltas(missing, "standard", NAMES)
    assert not missing.exists()


def test_pooled_pairs_are_counted_per_model():
    # a card that ran one model's placebo only: its pairs, not 0 (the minimum over every model's gates)
    others = {"cuda/GPU-b/2": {"big decode@128": [], "big prefill@4096": [], "small decode@512": [0.1] * 5},
              "cuda/GPU-c/3": {"big decode@128": [0.1] * 3, "big prefill@4096": [0.1] * 2, "small decode@512": []}}
    assert pooled_pairs(others, NAMES) == {"cuda/GPU-b/2": {"small": 5}, "cuda/GPU-c/3": {"big": 2}}
