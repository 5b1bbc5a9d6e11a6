"""A/A history is only comparable under one measurement protocol: what changes a timed request changes the key."""
import pytest

from worker import config
from worker.config import EvalSettings


def _std():
    return EvalSettings(profile="standard").profile_settings("standard")


def test_the_per_step_logits_copy_and_its_pinning_are_part_of_the_protocol():
    p = _std()
    m = p.models[0]
    key = p.protocol_key(m)
    assert p.model_copy(update={"decode_step_logits": False}).protocol_key(m) != key
    assert p.model_copy(update={"pin_step_logits": False}).protocol_key(m) != key
    assert p.model_copy(update={"decode_tokens": p.decode_tokens + 1}).protocol_key(m) != key
    # a setting that does not touch timing (the guards' prompts) keeps the history
    assert p.model_copy(update={"prompts_per_seed": p.prompts_per_seed + 1}).protocol_key(m) == key


def test_a_new_timing_protocol_starts_a_new_history(monkeypatch):
    p = _std()
    before = p.protocol_key(p.models[0])
    monkeypatch.setattr(config, "TIMING_PROTOCOL", config.TIMING_PROTOCOL + 1)
    assert p.protocol_key(p.models[0]) != before


@pytest.mark.parametrize("update,rows", [({}, 64), ({"pin_step_logits": False}, 0), ({"decode_step_logits": False}, 0),
                                         ({"device": "cpu"}, 0)])
def test_pin_rows_only_when_step_logits_are_copied_on_cuda(update, rows):
    assert _std().model_copy(update=update).pin_rows() == rows
