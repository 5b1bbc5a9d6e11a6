"""The parallel factory writes the bytes the serial one did, whatever the pool size.

The pins are the bytes the serial factory made on one machine: a change to them there is a
change of every synthetic model. They hold per CPU: the orthonormal bases come from LAPACK, whose
MKL kernels round differently on another vendor's CPU (an AMD EPYC makes other low bits than the
machine of the first pins). So the pool-size tests compare against the serial factory on this
machine, and the pin test checks the pins of this CPU where they were recorded."""
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.config import ARCH, SHAPES, with_overrides
from runtime.gguf.names import expected_tensors
from runtime.gguf.writer import file_sha256, write_gguf
from runtime.synth import init as I
from runtime.synth.factory import make_plan, synthesize
from runtime.synth.stream import ChunkStream, chunks

PINNED_BY_CPU = {
    # the serial factory at commit 5890a1a, before the thread pool (the CPU was not recorded)
    "first": {
        ("tiny", "f32", 0): "6dcd52aca0848a22740388a581dc87cd79e121a4c7df75aef14bb00f227aad21",
        ("tiny", "bf16", 0): "08fd1c6d7ff4afa922f5b4fc968f2ef0291af26d971fc27959743360d1f90cbf",
        ("tiny", "q8_0", 0): "84764df3c54dec9f119a9bc7a2f0c4e05d879125c2f6f84471ef6c69066731ce",
        ("tiny", "q4_k_m", 0): "6efb9032c7f197f93b7fd2efc10300e24591a48cfb061d20567e7841f885944b",
        ("tiny", "q4_k_m", 1): "7e9a8b577e8d00041d6bfba9dc2660f178d459062cef8609873625c3b0077650",
        ("wide", "q8_0", 0): "99855efee7a6056118a47faa899927eda85a2d425629d357de658aa3c5adab6c",
    },
    # workers=1 on the session-4 CI machine (AMD EPYC, torch 2.13.0+cpu with MKL 2024.2)
    "AuthenticAMD/AVX512": {
        ("tiny", "f32", 0): "25892d48115ad3d98598ed41ef028f6db655f5278213e032d957449c0c1edee8",
        ("tiny", "bf16", 0): "4c95ec3f36ea1f859f9aa238c15f05cf838f0fedb01a85bb04714b8697df0dd9",
        ("tiny", "q8_0", 0): "b684f54153aa29d4a56b56418ce7c8c09812f4c5a3a2da06694a737a6fae220f",
        ("tiny", "q4_k_m", 0): "8289f1321882acdf846069cab96a23ba4d5ee3377befd32fbb9ce19aa67a6067",
        ("tiny", "q4_k_m", 1): "e509a755d641491f1d0ea7908c7ff630a02efc3053fcab1eedb6626de40f7a94",
        ("wide", "q8_0", 0): "cc209765c9f2cd9eac5f32f673edef069ca5094b32f925f4637bb926de9ddca0",
    },
}
TINY = [("f32", 0), ("bf16", 0), ("q8_0", 0), ("q4_k_m", 0), ("q4_k_m", 1)]


def cpu_key() -> str:
    """CPU vendor / torch's CPU capability: what decides the LAPACK kernels' rounding here."""
    vendor = "unknown"
    info = Path("/proc/cpuinfo")
    if info.exists():
        vendor = next((ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines()
                       if ln.startswith("vendor_id")), vendor)
    return f"{vendor}/{torch.backends.cpu.get_cpu_capability()}"


# tiny with a 40960-token vocabulary: the embedding and output tensors come in 2 chunks each.
WIDE = with_overrides(SHAPES["tiny"], vocab_size=40960, name="tiny-wide")


@pytest.mark.parametrize("quant,seed", TINY)
def test_tiny_matches_the_serial_factory(tmp_path, quant, seed):
    serial = synthesize("tiny", quant, seed, tmp_path / "s.gguf", workers=1)
    assert synthesize("tiny", quant, seed, tmp_path / "x.gguf", workers=3).sha256 == serial.sha256


def test_pool_size_and_budget_change_no_byte(tmp_path):
    one = synthesize("tiny", "q4_k_m", 0, tmp_path / "1.gguf", workers=1)
    # a budget of one byte: every chunk made and written alone
    lean = synthesize("tiny", "q4_k_m", 0, tmp_path / "b.gguf", workers=4, inflight_bytes=1)
    assert one.sha256 == lean.sha256


@pytest.mark.parametrize("grouped", [False, True])
def test_chunked_embeddings_and_grouped_quantization_keep_the_bytes(tmp_path, grouped):
    """The consumer's grouped quantization (the GPU path) on the CPU: the serial factory's bytes."""
    p = make_plan(WIDE, "q8_0", 0)
    st = ChunkStream(p.tensors, p.cfg, 0, I.DEFAULT, "cpu", workers=2, inflight_bytes=1 << 24,
                     consumer_quantizes=grouped)
    try:
        write_gguf(tmp_path / "w.gguf", ARCH, p.metadata, p.tensors, st.pieces)
    finally:
        st.close()
    assert file_sha256(tmp_path / "w.gguf") == synthesize(WIDE, "q8_0", 0, tmp_path / "s.gguf", workers=1).sha256


def test_serial_factory_makes_the_pinned_bytes(tmp_path):
    """The bytes of every synthetic model stay put: on a CPU with recorded pins they must match."""
    key = cpu_key()
    got = {("tiny", q, s): synthesize("tiny", q, s, tmp_path / f"{q}{s}.gguf", workers=1).sha256 for q, s in TINY}
    got[("wide", "q8_0", 0)] = synthesize(WIDE, "q8_0", 0, tmp_path / "w.gguf", workers=1).sha256
    if key not in PINNED_BY_CPU and got != PINNED_BY_CPU["first"]:
        pytest.skip(f"no pins recorded for CPU {key}; its serial bytes: {got}")
    assert got == PINNED_BY_CPU.get(key, PINNED_BY_CPU["first"])


def test_torch_thread_count_is_left_as_it_was(tmp_path):
    before = torch.get_num_threads()
    synthesize("tiny", "f32", 0, tmp_path / "x.gguf", workers=2)
    assert torch.get_num_threads() == before


def test_chunks_cover_every_tensor_and_match_generate():
    p = make_plan(WIDE, "q8_0", 0)
    cs = chunks(p.tensors, I.DEFAULT)
    for t in p.tensors:
        mine = [c for c in cs if c.spec.name == t.name]
        assert [c.index for c in mine] == list(range(I.chunk_count(t.name, t.shape)))
        assert sum(c.n_elems for c in mine) == int(np.prod(t.shape))
    name, shape = "output.weight", p.cfg and expected_tensors(WIDE)["output.weight"]
    whole = list(I.generate(name, shape, WIDE, 0))
    assert len(whole) == 2 and torch.equal(whole[1], I.generate_chunk(name, shape, WIDE, 0, I.DEFAULT, 1))


def test_uses_basis_names_exactly_the_tensors_built_on_orthonormal_bases(monkeypatch):
    cfg = SHAPES["tiny"]
    calls = []
    real = I.orthonormal.__wrapped__
    monkeypatch.setattr(I, "orthonormal", lambda *a: calls.append(a) or real(*a))
    for name, shape in expected_tensors(cfg).items():
        calls.clear()
        list(I.generate(name, shape, cfg, 0))
        assert bool(calls) == I.uses_basis(name, cfg), name


def test_runs_group_same_type_chunks_up_to_the_cap_and_carry_cpu_chunks_along():
    from runtime.gguf.types import GGMLType as T
    from runtime.gguf.writer import TensorSpec
    from runtime.synth.stream import PASSTHROUGH, Chunk, runs

    def c(ttype, n):
        return Chunk(TensorSpec("x", (n,), ttype, 0), 0, n)

    seq = [c(T.F32, 1), c(T.Q4_K, 4), c(T.F32, 1), c(T.Q4_K, 4), c(T.Q4_K, 4), c(T.Q6_K, 2), c(T.Q4_K, 2)]
    grouped = lambda ch: ch.spec.type not in PASSTHROUGH  # noqa: E731
    assert runs(seq, grouped, cap=8) == [1, 3, 1, 1, 1]  # F32 | Q4 F32 Q4 (cap) | Q4 | Q6 | Q4
    assert runs(seq, grouped, cap=100) == [1, 4, 1, 1]
    assert runs(seq, lambda ch: False, cap=100) == [1] * len(seq)
