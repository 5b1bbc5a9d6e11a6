"""bench/runtime/long_context.py's comparison on a stand-in model: every position, the serving path's last row
and the decode steps after the prompt are each checked, one-call and piecewise engine rows agree with the
reference, and an engine that is wrong only far into the prompt, only when asked for the last row alone, or
only in decode fails its part (the GPU receipt itself is run on the device)."""
from types import SimpleNamespace

import pytest
import torch

from bench.runtime.long_context import KL_BAR, Agreement, check_length, overall_pass

VOCAB = 64


def _logits(tokens: list[int]) -> torch.Tensor:
    """Rows of a toy causal model: row i depends on every token up to i (a running hash)."""
    rows, h = [], 0
    for t in tokens:
        h = (h * 31 + int(t) + 7) % 1009
        g = torch.Generator().manual_seed(h)
        rows.append(torch.randn(VOCAB, generator=g) * 3)
    return torch.stack(rows)


class Reference:
    device = torch.device("cpu")

    def new_state(self, kv_capacity):
        return SimpleNamespace(seen=[])

    def forward(self, ids, state, all_logits=False):
        state.seen += ids.tolist()
        out = _logits(state.seen)[-len(ids):]
        return out if all_logits else out[-1]


class Engine:
    """Stand-in engine; `fault(where, position, rows)` may bend the rows it returns."""

    def __init__(self, fault=None):
        self.config = SimpleNamespace(vocab_size=VOCAB)
        self.fault = fault or (lambda where, pos, rows: rows)
        self.calls = []

    def reset(self):
        self.seen = []

    def prefill(self, ids, all_logits=False):
        pos0 = len(self.seen)
        self.seen += torch.as_tensor(ids).tolist()
        self.calls.append((pos0, len(ids), all_logits))
        rows = self.fault("prefill" if all_logits else "serving", pos0, _logits(self.seen)[pos0:])
        return rows if all_logits else rows[-1]

    def decode(self, t):
        self.seen.append(int(t))
        return self.fault("decode", len(self.seen) - 1, _logits(self.seen)[-1:])[0]


def _args(**kw):
    return SimpleNamespace(**{"device": "cpu", "decode": 3, "piece": 8, "logits_gb": 1.0, **kw})


IDS = [int(x) for x in torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(1))]


@pytest.mark.parametrize("logits_gb", [1.0, 1e-9])  # all rows from one call / from calls of --piece tokens
def test_an_exact_engine_passes_every_part(logits_gb):
    eng = Engine()
    rec = check_length(eng, Reference(), IDS, 30, _args(logits_gb=logits_gb))
    assert rec["pass"] is True and rec["all_positions"]["positions"] == 30
    assert rec["all_positions"]["kl_mean"] < 1e-9 and rec["decode_after"]["positions"] == 3
    if logits_gb < 1:
        assert rec["engine_rows"] == "calls of 8 tokens"
        assert [c[:2] for c in eng.calls if c[2]] == [(0, 8), (8, 8), (16, 8), (24, 6)]
    else:
        assert rec["engine_rows"] == "one call" and (0, 30, True) in eng.calls


def _noisy(rows):
    return rows + torch.randn(rows.shape, generator=torch.Generator().manual_seed(5)) * 4


def test_drift_far_into_the_prompt_fails_and_shows_in_its_band():
    late = Engine(lambda where, pos, rows: torch.cat([rows[:max(0, 20 - pos)], _noisy(rows[max(0, 20 - pos):])])
                  if where == "prefill" else rows)
    rec = check_length(late, Reference(), IDS, 30, _args(piece=30))
    assert rec["all_positions"]["pass"] is False and rec["pass"] is False
    assert rec["decode_after"]["pass"] is True
    assert rec["serving_last_row"]["pass"] is False  # the serving row no longer matches the drifted rows


def test_a_late_band_fails_even_when_the_mean_passes():
    a = Agreement([36, 40])
    want = torch.zeros(40, VOCAB)
    want[:, 0] = 5
    got = want.clone()
    got[36:, 0] = 4.3  # the last 4 of 40 rows drift (KL 0.055 each): the mean 0.0055 is under the bar, their band is not
    a.add(want, got, 0)
    s = a.summary()
    assert s["kl_mean"] <= KL_BAR and s["top1"] == 1.0
    assert s["bands"][-1]["kl_mean"] > KL_BAR and s["pass"] is False


def test_a_model_that_never_ran_makes_the_receipt_null_not_a_pass():
    ran = {"0.8b": {"lengths": {"32": {"pass": True}}}, "9b": {"error": "synth failed"}}
    assert overall_pass(ran, ["0.8b", "9b"], [32]) is None
    assert overall_pass(ran, ["0.8b"], [32]) is True
    assert overall_pass({"0.8b": {"lengths": {"32": {"pass": False}}}}, ["0.8b"], [32]) is False


def test_a_serving_path_that_differs_from_the_all_rows_path_fails():
    lazy = Engine(lambda where, pos, rows: _noisy(rows) if where == "serving" else rows)
    rec = check_length(lazy, Reference(), IDS, 30, _args())
    assert rec["all_positions"]["pass"] is True and rec["serving_last_row"]["pass"] is False and rec["pass"] is False


def test_decode_after_a_long_prompt_is_checked():
    bad = Engine(lambda where, pos, rows: _noisy(rows) if where == "decode" else rows)
    rec = check_length(bad, Reference(), IDS, 30, _args())
    assert rec["decode_after"]["pass"] is False and rec["pass"] is False


def test_agreement_bands_and_non_finite_rows():
    a = Agreement([4, 8])
    want = torch.zeros(8, VOCAB)
    want[:, 0] = 5
    got = want.clone()
    got[6, 1] = 50  # one wrong argmax in the second band
    a.add(want, got, 0, rows_per_step=3)
    s = a.summary()
    assert [b["positions"] for b in s["bands"]] == [4, 4] and s["bands"][0]["top1"] == 1.0
    assert s["bands"][1]["top1"] == 0.75 and s["positions"] == 8
    got[2, 0] = float("nan")
    b = Agreement([8])
    b.add(want, got, 0)
    assert b.summary()["finite"] is False and b.summary()["pass"] is False
    assert Agreement([1]).summary()["pass"] is None  # nothing compared is not a pass
