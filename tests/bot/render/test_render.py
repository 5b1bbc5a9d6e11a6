"""The words GitHub shows: verdict blocks, labels, and the committed example comments."""
from __future__ import annotations

import re

from bot import render
from bot.github.labels import labels_for
from tests.bot.render import render_examples
from bot.testing.fake_evaluation import result_for
from worker.config import EvalSettings
from worker.records import Verdict


def test_committed_examples_are_current():
    for name, text in render_examples.examples().items():
        assert (render_examples.OUT / name).read_text() == text, f"re-run python -m tests.bot.render.render_examples ({name})"


def test_infra_never_reads_as_a_verdict_on_the_pr():
    text = render_examples.examples()["comment-infra.md"]
    current = text.split("<details>")[0]
    assert "not a verdict on your PR" in current and "REJECT" not in current
    assert "Gave up after 3 attempts" in current and "/eval rerun" in current
    retrying = render_examples.examples()["comment-infra-retrying.md"].split("<details>")[0]
    assert "Retrying automatically (attempt 2 of 3)" in retrying


def test_comment_prints_both_one_sided_floors():
    """Each gate shows its slower-side and faster-side floor (a pair counts beyond either), not only the larger."""
    text = render_examples.examples()["comment-xl.md"]
    assert "noise floors (slower / faster)" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| qwen35-tiny | decode@") and "not measured" not in ln]
    assert rows and all("−1.2% / +1.5%" in ln for ln in rows), rows


def test_older_results_without_both_floors_show_the_larger_one():
    run = render_examples.view(3, "xl", "b699eb5c3d")
    for g in run.result.gates:
        g.floor_slower = g.floor_faster = None
    text = render.sticky_comment(current=run, earlier=[], head_sha="b699eb5c3d", awaiting_approval=False,
                                 approval_label="eval-approved", models=["qwen35-tiny"])
    assert "±1.5%" in text and "/ +" not in text


def test_widened_floors_say_so():
    """A gate whose floors were widened for a noisier host shows by how much; others show nothing extra."""
    run = render_examples.view(3, "xl", "b699eb5c3d")
    run.result.gates[0].floor_widening = 1.37
    text = render.sticky_comment(current=run, earlier=[], head_sha="b699eb5c3d", awaiting_approval=False,
                                 approval_label="eval-approved", models=["qwen35-tiny"])
    assert text.count("(×1.37: host noisier)") == 1
    assert "host noisier" not in render_examples.examples()["comment-xl.md"]


def test_missing_numbers_are_said_not_invented():
    text = render_examples.examples()["comment-infra.md"]
    assert "?" not in text.replace("<!--", "")
    assert not re.search(r"\| 0(\.0+)? \|", text) and "not measured: measurement discarded" in text


def test_labels():
    tiers = EvalSettings()
    kw = dict(repo="r", pr=1, base_sha="b", head_sha="h")
    assert labels_for(result_for("xl", **kw), tiers) == ["eval:XL", "eval-qwen35-tiny:XL"]
    assert labels_for(result_for("xl", speedup=0.07, **kw), tiers) == ["eval:XL", "eval-qwen35-tiny:M"]
    assert labels_for(result_for("slow", **kw), tiers) == ["eval:REJECT", "eval-qwen35-tiny:REJECT",
                                                         "regression-qwen35-tiny-decode@4096"]
    assert labels_for(result_for("infra", **kw), tiers) == ["eval:INFRA"]
    assert labels_for(result_for("none", **kw), tiers) == ["eval:none", "eval-qwen35-tiny:none"]


def test_check_conclusions():
    from bot.enums import check_conclusion
    assert check_conclusion(Verdict.INFRA).value == "action_required"
    assert check_conclusion(Verdict.BUILD_FAILED).value == "failure"
    assert check_conclusion(Verdict.NONE).value == "neutral"
    assert check_conclusion(Verdict.S).value == "success"


def test_command_parsing():
    from bot.enums import Command
    from bot.handlers import parse_command
    assert parse_command("/eval") is Command.EVAL
    assert parse_command("LGTM\n/eval rerun\nthanks") is Command.RERUN
    assert parse_command("/eval cancel") is Command.CANCEL
    assert parse_command("/eval status ") is Command.STATUS
    assert parse_command("/eval destroy") is None
    assert parse_command("please /eval this") is None
    assert parse_command(None) is None


def test_pct_formats():
    assert render.pct(0.4521) == "+45.2%" and render.pct(-0.081) == "-8.1%"
    assert render.pct(None, "timeout") == "n/a (timeout)" and render.pct(float("nan")) == "n/a"


def test_worker_report_prints_both_one_sided_floors():
    """`tokengate eval`'s markdown (worker/report.py, templates/eval_report.md.j2) shows both floors too."""
    from worker.report import comment_markdown
    text = comment_markdown(result_for("xl", repo="r", pr=1, base_sha="b", head_sha="h"))
    rows = [ln for ln in text.splitlines() if ln.startswith("| qwen35-tiny | decode@")]
    assert rows and all("−1.2% / +1.5%" in ln for ln in rows), rows
    from rich.console import Console
    from worker.report import verdict_table
    console = Console(width=200, record=True)
    console.print(verdict_table(result_for("xl", repo="r", pr=1, base_sha="b", head_sha="h")))
    assert "−1.2% / +1.5%" in console.export_text()  # the terminal table too


_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")  # CommonMark: closed by a run of the same length


def test_a_backtick_in_a_branch_name_cannot_close_its_code_span():
    """git allows ` < > | in ref names: a base branch named to break out of its code span must stay inside it."""
    evil = "rel` <!-- hidden | **XL** x"
    texts = [render.render("main_moved.md.j2", base_ref=evil, winner_number=7, needs_rebase=False),
             render.render("merge_first_winner.md.j2", speedup=0.2, gate="decode@512", verdict=Verdict.XL,
                           head_sha="a" * 40, base_ref=evil, base_sha="b" * 40)]
    for text in texts:
        outside = _CODE_SPAN.sub("", text)
        assert "<!--" not in outside and "**XL**" not in outside, outside
        assert evil in text
