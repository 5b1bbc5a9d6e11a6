"""Logits from chosen positions (issue 13 item 5): a long guard prompt at a real vocabulary does not
move all its logits. The revision keeps the prefill's logits; the parent asks for rows it drew after
the prefill answered, through its own shared memory. Tiny shapes here; the byte budget is scaled down."""
from __future__ import annotations

import numpy as np
import pytest

from worker.guards import scoring as guards
from worker.guards.scoring import long_positions, score_revisions
from worker.harness.client import RevisionFault

from tests.worker.helpers import loaded_fake


def test_positions_fit_the_budget_and_sit_in_the_deep_half():
    assert long_positions(64, 100, budget=64 * 100 * 4) is None  # all fit: all rows
    pos = long_positions(4096, 248320, budget=1 << 30)
    assert len(pos) * 248320 * 4 <= 1 << 30 and len(pos) == (1 << 30) // (248320 * 4)
    assert min(pos) >= 2048 and pos[-1] == 4095 and pos == sorted(set(pos))
    assert long_positions(4096, 248320) != long_positions(4096, 248320)  # drawn in secret, per evaluation
    assert long_positions(100, 10, budget=60 * 40) == list(range(50, 100))  # the deep half fits: all of it
    assert 32768 * 248320 * 4 > 30 << 30 and len(long_positions(32768, 248320)) == 1081  # `full`: 32 GB not moved


@pytest.mark.sandbox
@pytest.mark.timed
def test_the_driver_returns_only_the_rows_asked_for_after_the_prefill(tmp_path):
    with loaded_fake(tmp_path) as proc:
        ids = list(range(1, 301))
        proc.request("stage", key="k", ids=ids, phase="accuracy", timeout=10)
        full = guards._logits(proc, "k", 300, 10)
        rows = [150, 151, 200, 299]
        part = guards._logits(proc, "k", 300, 10, positions=rows)
        assert part.shape == (4, proc.vocab)
        np.testing.assert_array_equal(part, full[rows])
        with pytest.raises(RevisionFault) as e:  # rows are sent once per held prefill
            proc.request("rows", rows=[1], phase="accuracy", timeout=10)
        assert e.value.kind == "protocol"


class _Proc:
    """A revision/reference stand-in that answers `logits` (hold) and `rows` like the driver."""

    def __init__(self, vocab, role):
        self.vocab, self.role, self.staged, self.moved = vocab, role, [], 0

    def request(self, op, **kw):
        if op == "stage":
            self.staged.append(kw["ids"])
            return {}, 0.0
        if op == "logits":
            ids = np.asarray(self.staged[-1])
            self._all = np.sin(np.outer(ids + 1, np.arange(self.vocab)) * 0.01).astype(np.float32)
            if kw.get("hold"):
                return {"held": [len(ids), self.vocab]}, 0.0
            self._last = self._all
        else:  # rows
            self._last = self._all[kw["rows"]]
        return {"shape": list(self._last.shape)}, 0.0

    def read_logits(self, resp, rows, phase):
        assert resp["shape"][0] == rows
        self.moved = max(self.moved, self._last.nbytes)
        return self._last


def test_the_long_guard_prompt_is_scored_without_moving_all_its_logits(tmp_path, cache, monkeypatch):
    from worker.config import DEFAULT_PROFILES

    vocab, n = 512, 1024
    budget = 200 * vocab * 4  # stands in for 1 GiB at a real vocabulary
    monkeypatch.setattr(guards, "LONG_LOGITS_MAX_BYTES", budget)
    prof = DEFAULT_PROFILES["quick"].model_copy(update={"prompt_len": 32, "long_context": n})
    procs = {r: _Proc(vocab, r) for r in ("base", "head")}
    ref = _Proc(vocab, "reference")
    sc = score_revisions(procs, ref, vocab=vocab, model_sha="1" * 64, ref_version="v", profile=prof)
    assert sc["head"].long_context == n and sc["head"].long_scored == 200
    assert max(len(x) for x in procs["head"].staged) == n  # the whole long prompt went through the model
    assert all(p.moved <= budget for p in (*procs.values(), ref))  # never all n x vocab logits
    assert "200 positions" in sc["head"].note and "[512, 1024)" in sc["head"].note
