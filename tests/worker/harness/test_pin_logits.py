"""The driver page-locks exactly the per-step rows it was asked for, unlocks before re-locking, and a box
that refuses keeps the pageable copy and says why (never fatal). CUDA is faked: CI has no GPU."""
import importlib.util
import mmap
from pathlib import Path
from types import SimpleNamespace

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "tg_driver", Path(__file__).resolve().parents[3] / "worker" / "harness" / "driver.py")
driver_mod = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(driver_mod)


class FakeCudart:
    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append(("register", ptr, size))
        return 1 if self.fail else 0

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return 0


def _driver(cudart, cuda=True, size=64 << 20):
    shm = mmap.mmap(-1, size)
    d = driver_mod.Driver("/nonexistent", shm)
    d.vocab = 1000
    d.torch = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: cuda, is_initialized=lambda: cuda,
                                                   cudart=lambda: cudart))
    return d


def test_pins_the_rows_page_rounded_and_unpins_before_pinning_again():
    rt = FakeCudart()
    d = _driver(rt)
    got = d.pin_logits({"rows": 3})
    want = -(-3 * 1000 * 4 // mmap.PAGESIZE) * mmap.PAGESIZE
    assert got == {"ok": True, "bytes": want} and d.pinned == want
    assert rt.calls[-1][0] == "register" and rt.calls[-1][2] == want
    assert d.pin_logits({"rows": 0}) == {"ok": True, "bytes": 0}
    assert rt.calls[-1][0] == "unregister" and d.pinned == 0


def test_never_more_than_the_shared_buffer():
    rt = FakeCudart()
    d = _driver(rt, size=1 << 20)
    assert d.pin_logits({"rows": 10_000})["bytes"] == 1 << 20


def test_a_refusal_keeps_the_pageable_copy_says_why_and_clears_the_pending_error(monkeypatch):
    """torch's binding leaves a refused cudaHostRegister's error pending: the next kernel launch would raise it."""
    cleared = []
    monkeypatch.setattr(driver_mod, "_clear_cuda_error", lambda: cleared.append(1))
    d = _driver(FakeCudart(fail=True))
    got = d.pin_logits({"rows": 2})
    assert got["bytes"] == 0 and "cudaHostRegister" in got["why"] and d.pinned == 0 and cleared == [1]


def test_clearing_without_a_cuda_runtime_loaded_is_harmless():
    driver_mod._clear_cuda_error()  # no libcudart in this CPU process: nothing to read, nothing raised


@pytest.mark.parametrize("torch_present", [False, True])
def test_no_cuda_pins_nothing(torch_present):
    rt = FakeCudart()
    d = _driver(rt, cuda=False)
    if not torch_present:
        d.torch = None
    assert d.pin_logits({"rows": 2})["bytes"] == 0 and rt.calls == []


@pytest.mark.parametrize("pinned_rows", [0, 1, 3, 10])
def test_a_copy_past_the_pinned_rows_is_split_and_lands_whole(pinned_rows):
    """CUDA refuses one copy that runs past a registered range (cudaErrorInvalidValue, seen on the H200
    when the accuracy phase put 256 rows after 64 were pinned): the driver copies the two parts apart."""
    torch = pytest.importorskip("torch")
    import numpy as np

    d = _driver(FakeCudart(), size=1 << 20)
    d.torch = torch
    d.pinned = pinned_rows * 1000 * 4
    rows = torch.arange(5 * 1000, dtype=torch.float32).reshape(5, 1000)
    assert d._put(rows) == [5, 1000]
    got = np.frombuffer(d.shm, dtype=np.float32, count=5000)
    assert np.array_equal(got, rows.reshape(-1).numpy())


@pytest.mark.parametrize("n,pinned", [(10, 0), (10, 4), (10, 10), (10, 64), (1, 1), (5, -3)])
def test_no_copy_span_crosses_the_pinned_boundary(n, pinned):
    spans = driver_mod._copy_spans(n, pinned)
    assert spans[0][0] == 0 and spans[-1][1] == n and all(a < b for a, b in spans)
    assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))  # contiguous, nothing lost
    assert not any(a < pinned < b for a, b in spans)


# -- the parent's side: base's pin is checked against the parent's own figure (worker/pipeline.py) ----------

def _proc(role, capacity=1 << 30):
    from worker.harness.shm import LogitsBuffer

    return SimpleNamespace(role=role, shm=SimpleNamespace(pinned_bytes=LogitsBuffer.pinned_bytes.__get__(
        SimpleNamespace(capacity=capacity))))


def test_a_host_that_would_not_pin_for_base_is_infra_never_the_prs():
    from worker.harness.client import RevisionFault
    from worker.pipeline import _pin_report
    from worker.records import InfraKind, Verdict
    from worker.verdicts.faults import classify

    want = -(-64 * 1000 * 4 // mmap.PAGESIZE) * mmap.PAGESIZE
    ok = _pin_report(_proc("base"), {"vocab_size": 1000, "pinned": {"ok": True, "bytes": want}}, 64)
    assert ok == {"bytes_reported": want, "expected": want, "why": None}
    with pytest.raises(RevisionFault) as e:
        _pin_report(_proc("base"), {"vocab_size": 1000, "pinned": {"bytes": 0, "why": "cudaHostRegister: 1"}}, 64)
    f = classify(e.value, "m")
    assert f.verdict == Verdict.INFRA and f.infra_kind == InfraKind.SANDBOX_FAILURE and "timed alike" in str(f)


def test_a_heads_word_is_only_recorded_and_kept_short():
    from worker.pipeline import _pin_report

    r = _pin_report(_proc("head"), {"vocab_size": 1000, "pinned": {"bytes": 2 ** 40, "why": "x" * (3 << 20)}}, 64)
    assert r["bytes_reported"] == 2 ** 40 and len(r["why"]) == 200  # a lie costs the head nothing here, and no bloat
    assert _pin_report(_proc("head"), {"vocab_size": 1000, "pinned": "junk"}, 64)["bytes_reported"] is None
    assert _pin_report(_proc("base"), {"vocab_size": 1000}, 0) is None  # nothing asked, nothing checked


def test_a_base_without_cuda_has_nothing_to_pin():
    from worker.pipeline import _pin_report

    said = {"vocab_size": 1000, "pinned": {"bytes": 0, "cuda": False, "why": "no CUDA in this process"}}
    assert _pin_report(_proc("base"), said, 64)["bytes_reported"] == 0  # recorded, not a fault: no device copies


def test_the_parents_figure_is_the_drivers():
    from worker.harness.shm import LogitsBuffer

    d = _driver(FakeCudart(), size=64 << 20)
    buf = SimpleNamespace(capacity=len(d.shm))
    for rows in (1, 3, 64, 10_000):
        assert d.pin_logits({"rows": rows})["bytes"] == LogitsBuffer.pinned_bytes(buf, rows, d.vocab)
