"""The guards' arithmetic on the worker's own device: float64 a few rows at a time, and the cache handed back.

Whole blocks kept every float64 temporary of the long prompt's scored rows in the worker's CUDA cache (~17 GB
on the 9B), and the fp32 reference then ran out of memory in verify on an 80 GB card
(bench/receipts/gpu-e2e-h100-20261206T172010Z.json)."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from worker.guards import arith

from tests.worker.guards.test_long_rows import _Proc

CPU = torch.device("cpu")


def _blocks(rows=10, vocab=257):
    rng = np.random.default_rng(1)
    ref_logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    rev = (ref_logits + 0.4 * rng.standard_normal((rows, vocab))).astype(np.float32)
    rev[3] = ref_logits[3][::-1]  # one row whose argmax moves
    return ref_logits, rev


@pytest.mark.parametrize("chunk", [1, 3, 4, 64])
def test_scoring_a_few_rows_at_a_time_gives_the_whole_blocks_figures(chunk):
    ref_logits, rev = _blocks()
    whole_lp = arith.log_softmax(ref_logits, CPU, chunk_rows=10 ** 9)
    np.testing.assert_array_equal(arith.log_softmax(ref_logits, CPU, chunk_rows=chunk), whole_lp)
    whole = arith.Reference(whole_lp, CPU, chunk_rows=10 ** 9).compare(rev)
    top1, kl_mean, kl_max = arith.Reference(whole_lp, CPU, chunk_rows=chunk).compare(rev)
    assert top1 == whole[0] and top1 < 1.0
    assert kl_mean == pytest.approx(whole[1], rel=1e-12) and kl_max == whole[2]


def test_no_float64_temporary_spans_more_than_one_step_of_rows(monkeypatch):
    ref_logits, rev = _blocks(rows=10)
    seen = []
    real = torch.log_softmax

    def spy(x, *a, **k):
        seen.append((x.shape[0], x.dtype))
        return real(x, *a, **k)

    monkeypatch.setattr(torch, "log_softmax", spy)
    lp = arith.log_softmax(ref_logits, CPU, chunk_rows=4)
    ref = arith.Reference(lp, CPU, chunk_rows=4)
    ref.compare(rev)
    assert seen and max(n for n, _ in seen) == 4 and all(d == torch.float64 for _, d in seen)
    assert ref.lp.dtype == torch.float32  # what stays resident between prompts is float32, not float64


def test_scoring_hands_its_cache_back_with_nothing_left_on_it(tmp_path, cache, monkeypatch):
    """score_revisions releases the device's cache at the end, after its last tensors are gone: a block
    still referenced cannot be handed back."""
    from worker.config import DEFAULT_PROFILES
    from worker.guards.scoring import score_revisions

    alive, released = [], []

    class Tracked(arith.Reference):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            alive.append(weakref.ref(self))

    def release(device):
        gc.collect()
        released.append(sum(r() is not None for r in alive))

    monkeypatch.setattr(arith, "Reference", Tracked)
    monkeypatch.setattr(arith, "release", release)
    prof = DEFAULT_PROFILES["quick"].model_copy(update={"prompt_len": 16, "long_context": 0, "seeds": [0, 1]})
    score_revisions({r: _Proc(64, r) for r in ("base", "head")}, _Proc(64, "reference"), vocab=64,
                    model_sha="2" * 64, ref_version="v", profile=prof)
    assert len(alive) == 2 * prof.prompts_per_seed  # one reference per prompt went through
    assert released == [0]  # released once, with no reference block still held
