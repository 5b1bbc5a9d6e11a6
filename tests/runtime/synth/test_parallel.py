"""The parallel factory writes the bytes the serial one did, whatever the pool size.

PINNED were computed with the serial factory (commit 5890a1a) before the thread pool
existed; a change to them is a change of every synthetic model."""
import numpy as np
import pytest
import torch

from runtime.config import ARCH, SHAPES, with_overrides
from runtime.gguf.names import expected_tensors
from runtime.gguf.writer import file_sha256, write_gguf
from runtime.synth import init as I
from runtime.synth.factory import make_plan, synthesize
from runtime.synth.stream import ChunkStream, chunks

PINNED = {
    ("tiny", "f32", 0): "6dcd52aca0848a22740388a581dc87cd79e121a4c7df75aef14bb00f227aad21",
    ("tiny", "bf16", 0): "08fd1c6d7ff4afa922f5b4fc968f2ef0291af26d971fc27959743360d1f90cbf",
    ("tiny", "q8_0", 0): "84764df3c54dec9f119a9bc7a2f0c4e05d879125c2f6f84471ef6c69066731ce",
    ("tiny", "q4_k_m", 0): "6efb9032c7f197f93b7fd2efc10300e24591a48cfb061d20567e7841f885944b",
    ("tiny", "q4_k_m", 1): "7e9a8b577e8d00041d6bfba9dc2660f178d459062cef8609873625c3b0077650",
    ("wide", "q8_0", 0): "99855efee7a6056118a47faa899927eda85a2d425629d357de658aa3c5adab6c",
}
# tiny with a 40960-token vocabulary: the embedding and output tensors come in 2 chunks each.
WIDE = with_overrides(SHAPES["tiny"], vocab_size=40960, name="tiny-wide")


@pytest.mark.parametrize("quant,seed", [("f32", 0), ("bf16", 0), ("q8_0", 0), ("q4_k_m", 0), ("q4_k_m", 1)])
def test_tiny_matches_the_serial_factory(tmp_path, quant, seed):
    r = synthesize("tiny", quant, seed, tmp_path / "x.gguf", workers=3)
    assert r.sha256 == PINNED[("tiny", quant, seed)]


def test_pool_size_and_budget_change_no_byte(tmp_path):
    one = synthesize("tiny", "q4_k_m", 0, tmp_path / "1.gguf", workers=1)
    # a budget of one byte: every chunk made and written alone
    lean = synthesize("tiny", "q4_k_m", 0, tmp_path / "b.gguf", workers=4, inflight_bytes=1)
    assert one.sha256 == lean.sha256 == PINNED[("tiny", "q4_k_m", 0)]


@pytest.mark.parametrize("grouped", [False, True])
def test_chunked_embeddings_and_grouped_quantization_keep_the_bytes(tmp_path, grouped):
    """The consumer's grouped quantization (the GPU path) on the CPU: same bytes."""
    p = make_plan(WIDE, "q8_0", 0)
    st = ChunkStream(p.tensors, p.cfg, 0, I.DEFAULT, "cpu", workers=2, inflight_bytes=1 << 24,
                     consumer_quantizes=grouped)
    try:
        write_gguf(tmp_path / "w.gguf", ARCH, p.metadata, p.tensors, st.pieces)
    finally:
        st.close()
    assert file_sha256(tmp_path / "w.gguf") == PINNED[("wide", "q8_0", 0)]


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
