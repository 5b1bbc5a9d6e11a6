"""The sticky comment names the profile and the device the verdict was measured on (issue 19)."""
from __future__ import annotations

import dataclasses

from bot import render
from tests.bot.render.render_examples import view


def _with_host(run, host):
    result = dataclasses.replace(run.result, receipt={**run.result.receipt, "host": host})
    return dataclasses.replace(run, result=result, profile="standard")


def test_comment_names_profile_and_gpu():
    run = _with_host(view(1, "slow", "8e7e027aa1"), {"gpu": {"name": "NVIDIA H200"}, "cpu_model": "Xeon"})
    text = render.sticky_comment(current=run, earlier=[], head_sha="8e7e027aa1", awaiting_approval=False,
                                 approval_label="ok", models=[])
    assert "profile standard on NVIDIA H200" in text


def test_comment_says_cpu_when_no_gpu_measured_it():
    run = _with_host(view(1, "slow", "8e7e027aa1"), {"gpu": {"name": None, "reason": "CPU evaluation"},
                                                      "cpu_model": "Xeon"})
    assert render.device_name(run) == "CPU (Xeon)"
    assert render.device_name(dataclasses.replace(run, result=None)) == "the worker"


def test_comment_says_what_was_not_measured_or_checked_and_escapes_it():
    """The verdict's notes reach the sticky comment: a model not measured after a settled REJECT, outputs checked on
    one rep only. A note carries text built from the PR's own failure, so it is escaped like every other field."""
    run = view(1, "slow", "8e7e027aa1")
    notes = ["qwen35-0.8b: not measured: the verdict is already REJECT (qwen35-9b accuracy guard failed)",
             "qwen35-9b: outputs checked on the first process pair's verified rep only", "<img src=x> @team"]
    run = dataclasses.replace(run, result=dataclasses.replace(run.result, notes=notes))
    text = render.sticky_comment(current=run, earlier=[], head_sha="8e7e027aa1", awaiting_approval=False,
                                 approval_label="ok", models=[])
    assert "qwen35-0.8b: not measured: the verdict is already REJECT" in text
    assert "verified rep only" in text
    assert "<img" not in text and "@team" not in text


def test_a_gate_the_confirming_pairs_left_out_reads_slower_not_confirmed_not_within_noise():
    """A gate slower in its one pair, left out because another gate confirmed the slowdown (worker/gates/confirm.py),
    is never shown as noise."""
    run = view(1, "slow", "8e7e027aa1")
    gates = [dataclasses.replace(g, significant=False, regression=False, not_confirmed=True, n_pairs=1, rel_change=-0.1)
             for g in run.result.gates[:1]] + run.result.gates[1:]
    run = dataclasses.replace(run, result=dataclasses.replace(run.result, gates=gates))
    text = render.sticky_comment(current=run, earlier=[], head_sha="8e7e027aa1", awaiting_approval=False,
                                 approval_label="ok", models=[])
    row = next(ln for ln in text.splitlines() if ln.startswith(f"| {gates[0].model} | {gates[0].gate}"))
    assert row.endswith("| slower, not confirmed (1 pair) |"), row
