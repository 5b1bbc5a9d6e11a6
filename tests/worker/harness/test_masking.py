"""Staged timed prompts are masked; the driver unmasks them with the seed the timed request brings."""
import importlib.util

import numpy as np
import pytest

from worker.harness import masking
from worker.harness.client import DRIVER_SRC


def _driver():
    spec = importlib.util.spec_from_file_location("tg_driver_under_test", DRIVER_SRC)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("vocab", [7, 1024, 248320])
def test_the_driver_unmasks_what_the_parent_masked(vocab):
    ids = np.random.default_rng(vocab).integers(0, vocab, size=3001).tolist()
    masked, seed = masking.mask(ids, vocab)
    assert masked != ids and len(masked) == len(ids)  # a prompt staged in the clear could be precomputed
    d = _driver()
    assert d._unmask(masked, seed, vocab, None) == ids  # numpy-only revisions stage a list
    torch = pytest.importorskip("torch")
    got = d._unmask(torch.tensor(masked, dtype=torch.long), seed, vocab, torch)
    assert got.dtype == torch.long and got.tolist() == ids


def test_two_maskings_of_one_prompt_share_nothing():
    ids = list(range(500))
    (a, sa), (b, sb) = masking.mask(ids, 1000), masking.mask(ids, 1000)
    assert sa != sb and np.mean(np.asarray(a) == np.asarray(b)) < 0.05
