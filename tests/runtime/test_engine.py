"""The Engine contract (docs/protocol.md §2) on the reference backend."""
import os
from pathlib import Path

import pytest
import torch

import runtime
from runtime.engine import ReferenceEngine, load_engine
from runtime.gguf import GGUFError
from runtime.models.random_weights import random_weights, small_config
from tests.paths import TINY


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    # Tiny ops on a shared 2-core box: a second OpenMP thread only spins (3x slower under load).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


FIXTURES = TINY
F32_GGUF = FIXTURES / "qwen35-tiny4-f32.gguf"
needs_fixture = pytest.mark.skipif(not F32_GGUF.exists(), reason="qwen35-tiny fixture missing")

CFG = small_config()
WEIGHTS = random_weights(CFG, seed=5)
GEN = torch.Generator().manual_seed(11)
A = torch.randint(0, CFG.vocab_size, (70,), generator=GEN).tolist()  # more than one 64-token chunk
B = torch.randint(0, CFG.vocab_size, (9,), generator=GEN).tolist()


def engine(max_context=256):
    return ReferenceEngine.from_tensors(CFG, WEIGHTS, max_context=max_context)


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


@needs_fixture
def test_load_engine_fixture():
    e = runtime.load_engine(F32_GGUF, device="cpu", max_context=128, backend="auto")
    assert isinstance(e, ReferenceEngine)
    assert e.config.n_layers == 4 and e.config.vocab_size == 4096 and e.position == 0
    logits = e.prefill([1, 2, 3])
    assert logits.shape == (4096,) and logits.dtype == torch.float32 and e.position == 3
    assert e.prefill(torch.tensor([4, 5]), all_logits=True).shape == (2, 4096)
    assert e.decode(6).shape == (4096,) and e.position == 6
    stats = e.memory_stats()
    assert stats["weights_bytes"] == 12_632_624  # every F32 tensor once (tied head not counted twice)
    assert stats["state_bytes"] > 0 and stats["peak_bytes"] is None  # no peak counter on CPU


def test_prefill_then_decode_equals_one_prefill():
    whole = engine().prefill(A + B, all_logits=True)
    e = engine()
    parts = [e.prefill(A)] + [e.decode(t) for t in B]
    assert e.position == len(A) + len(B)
    stepped = torch.stack(parts)
    assert rel_err(stepped, whole[len(A) - 1 :]) < 1e-5


def test_prefill_in_two_calls_equals_one():
    whole = engine().prefill(A + B, all_logits=True)
    e = engine()
    first = e.prefill(A, all_logits=True)
    second = e.prefill(B, all_logits=True)
    assert rel_err(torch.cat([first, second]), whole) < 1e-5
    assert torch.equal(e.prefill([7]), e.snapshot()["last_logits"])


def test_snapshot_restore_bit_exact():
    e = engine()
    e.prefill(A)
    snap = e.snapshot()
    ref = [e.decode(t) for t in B] + [e.prefill(A[:20], all_logits=True)]
    for _ in range(2):  # a snapshot can be restored more than once
        e.restore(snap)
        assert e.position == len(A)
        again = [e.decode(t) for t in B] + [e.prefill(A[:20], all_logits=True)]
        assert all(torch.equal(x, y) for x, y in zip(ref, again))
    # restore into a fresh engine with differently sized KV buffers is exact too
    f = engine(max_context=100)
    f.restore(snap)
    e.restore(snap)
    assert f.generate_greedy(5) == e.generate_greedy(5)
    assert torch.equal(f.snapshot()["last_logits"], e.snapshot()["last_logits"])


def test_reset_starts_over():
    e = engine()
    first = e.prefill(A, all_logits=True)
    e.decode(B[0])
    e.reset()
    assert e.position == 0
    assert torch.equal(e.prefill(A, all_logits=True), first)


def test_generate_greedy_matches_decode_loop():
    e = engine()
    e.prefill(A)
    out = e.generate_greedy(6)
    f = engine()
    logits, manual = f.prefill(A), []
    for _ in range(6):
        t = int(logits.argmax())
        manual.append(t)
        logits = f.decode(t)
    assert out == manual and e.position == f.position == len(A) + 6
    assert torch.equal(e.snapshot()["last_logits"], logits)
    assert e.generate_greedy(0) == []


def test_engine_errors():
    e = engine(max_context=80)
    with pytest.raises(RuntimeError, match="preceding prefill"):
        e.generate_greedy(1)
    with pytest.raises(ValueError, match="exceed max_context 80"):
        e.prefill(list(range(81)))
    with pytest.raises(ValueError, match=r"token id 256 out of range \[0, 256\)"):
        e.prefill([1, 256])
    with pytest.raises(ValueError, match="token id -1"):
        e.decode(-1)
    with pytest.raises(ValueError, match="empty"):
        e.prefill([])
    with pytest.raises(ValueError, match="integers"):
        e.prefill(torch.tensor([1.0]))
    assert e.position == 0  # rejected calls leave the state alone
    e.prefill(A)
    with pytest.raises(ValueError, match="exceed max_context"):
        e.generate_greedy(11)
    e.generate_greedy(10)
    with pytest.raises(ValueError, match="exceed max_context"):
        e.decode(1)


def test_load_engine_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="backend"):
        load_engine(F32_GGUF, backend="fast")
    with pytest.raises(ValueError, match="max_context"):
        load_engine(F32_GGUF, max_context=0)
    with pytest.raises(ValueError, match="device"):
        load_engine(F32_GGUF, device="tpu")
    with pytest.MonkeyPatch.context() as mp:  # the kernel tests' interpreter mode allows triton on the CPU
        mp.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(ValueError, match="needs a CUDA device"):
            load_engine(F32_GGUF, device="cpu", backend="triton")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all, just bytes")
    with pytest.raises(GGUFError):
        load_engine(bad)


def test_triton_backend_missing_is_a_clear_error(monkeypatch):
    import sys

    import runtime.engine as engine_module

    # A None entry makes `from .triton import engine` raise ImportError, as a broken install would
    # (and the package attribute must go too: an earlier test may have imported the module).
    import runtime.triton

    monkeypatch.setitem(sys.modules, "runtime.triton.engine", None)
    monkeypatch.delattr(runtime.triton, "engine", raising=False)

    monkeypatch.setattr(engine_module, "_check_device", lambda device: torch.device("cuda"))
    with pytest.raises(RuntimeError, match="backend 'triton' is unavailable"):
        load_engine(F32_GGUF, device="cuda", backend="auto")
