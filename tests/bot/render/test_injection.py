"""A hostile pull request's text in what the bot writes on GitHub: the sticky comment, the check run, the
change-point comment and the CLI's report. The PR controls its runtime's error text (a fault's detail, its
log tail), its branch names and its title; none of it may open an HTML comment, forge a heading, a table row
or a link, or notify anyone."""
from __future__ import annotations

import re
from types import SimpleNamespace

from markdown_it import MarkdownIt

from bot import render
from bot.enums import EvalState
from bot.testing.fake_evaluation import result_for
from tests.bot.render.render_examples import view
from worker.records import Verdict

GITHUB_COMMENT_LIMIT = 65536  # GitHub refuses a longer body (422 "Body is too long")
HOSTILE = ("--> <!-- x --> \n\n### 🚀 tokengate: `eval:XL`\n| a | b |\n![px](https://t.example/p.gif) "
           "[docs](javascript:alert(1)) <img src=x onerror=alert(1)> @everyone @acme/maintainers é@octocat "
           "中@acme/gpu-team see https://evil.example/login or www.evil.example, mail admin@evil.example, "
           "fixes #1 and torvalds/linux#1, GH-2, $\\Huge\\color{green}\\text{XL}$ ``` ~~~ ` \u202e")


def md_html(text: str) -> str:
    """CommonMark + GFM tables, as GitHub parses a comment (before its autolinks, mentions and references)."""
    return MarkdownIt("commonmark").enable("table").render(text)


def mentions(text: str) -> list[str]:
    """What GitHub's mention filter would ping: `@name` or `@org/team` after start or an ASCII non-word
    character (html-pipeline's MentionFilter: `(?:^|\\W)@`, where Ruby's \\W is [^a-zA-Z0-9_]) — outside code."""
    prose = re.sub(r"<(pre|code)>.*?</\1>", "", md_html(text), flags=re.S)
    return re.findall(r"(?:^|[^a-zA-Z0-9_])@([a-zA-Z0-9][a-zA-Z0-9-]*(?:/[a-zA-Z0-9][a-zA-Z0-9_-]*)?)", prose)


def autolinks(text: str) -> list[str]:
    """What GitHub's GFM autolink extension would link (`www.`, `http(s)://`, `ftp://`, e-mail addresses) and
    which issues it would reference (`#1`, `owner/repo#1`, `GH-1`) — outside code."""
    prose = re.sub(r"<(pre|code)>.*?</\1>", "", md_html(text), flags=re.S)
    return re.findall(r"(?i)(?:https?|ftp)://\w|\bwww\.\w|[\w.+-]@[\w-]+\.\w|(?<![\w&])#\d|\bGH-\d", prose)


def hostile_failure(i: int, detail: str = HOSTILE) -> render.RunView:
    run = view(i, "none", f"{i:02x}" + "e" * 38)
    r = run.result
    r.verdict, r.gates, r.guards = Verdict.BUILD_FAILED, [], []
    r.summary = f"The head revision failed to build or run: {detail}"
    r.build_log_tail = detail
    return run


def test_the_clis_report_escapes_a_fault_detail_carried_in_its_notes():
    """A head fault confirmed clean on retry leaves its first attempt's detail (the PR's exception text) in the
    result's notes (worker/verdicts/attribution.py); `tokengate eval`'s comment.md listed notes unescaped."""
    from worker.report import comment_markdown
    r = result_for("none", repo="r", pr=1, base_sha="b" * 40, head_sha="h" * 40)
    r.notes = [f"attempt 1: raised (qwen35-tiny, decode: {HOSTILE}); the confirming attempt ran without that failure"]
    text = comment_markdown(r)
    html = md_html(text)
    assert "<!--" not in html and html.count("<h") == 1, html  # only the report's own heading
    assert "<img" not in html and "<a " not in html and "<table>" in html and html.count("<table>") == 2, html
    assert "@everyone" not in text and "@acme/maintainers" not in text, text
    assert text.rstrip().endswith("</sub>")  # nothing swallowed the footer


def test_a_bisection_failure_detail_cannot_inject_markdown_into_the_change_point_comment():
    """A bisection midpoint that fails records the measured revision's summary — its runtime's error text, which
    a merged PR's code controls — as the change point's detail; the comment printed it raw."""
    cp = SimpleNamespace(model="qwen35-tiny", gate="decode@512", rel_step=-0.08, previous_sha="a" * 40,
                         sha="b" * 40, false_alarm_rate=0.01, state="unresolved", good_sha="a" * 40,
                         bad_sha="b" * 40, culprit_sha=None,
                         detail=f"measuring ccccccc failed: The head revision failed to build or run: {HOSTILE}")
    text = render.render("change_point.md.j2", cp=cp, repo=SimpleNamespace(default_branch="main"), pr=None,
                         url=None)
    html = md_html(text)
    assert "<!--" not in html and html.count("<h") == 1, html
    assert "<img" not in html and "<a " not in html and "<table" not in html, html
    assert mentions(text) == [], mentions(text)


def test_the_clis_report_makes_no_mention_link_or_math_from_pr_text():
    """`tokengate eval`'s comment.md shares safe_text with the bot: its escaping left `é@octocat`, bare URLs,
    `#1` and `$…$` to GitHub (only the bot's own filter defused them)."""
    from worker.report import comment_markdown
    r = result_for("none", repo="r", pr=1, base_sha="b" * 40, head_sha="h" * 40)
    r.notes = ["attempt 1: é@octocat 中@acme/gpu-team see https://evil.example www.evil.example #1 GH-2 "
               "$\\Huge\\text{XL}$ (decode@512 kept)"]
    text = comment_markdown(r)
    assert mentions(text) == [] and autolinks(text) == [], (mentions(text), autolinks(text))
    assert not re.search(r"(?<!\\)\$", text) and "decode@512" in text, text


def test_a_mention_after_a_non_ascii_letter_is_defused():
    """GitHub's mention boundary is an ASCII non-word character: `é@octocat` and `中@acme/gpu-team` ping,
    while safe_text's `(?<![\\w])@` (Unicode \\w) took é and 中 for word characters and left them."""
    run = hostile_failure(1, "CUDA error é@octocat 中@acme/gpu-team (decode@512 kept)")
    texts = [render.sticky_comment(current=run, earlier=[], awaiting_approval=False, approval_label="eval-approved",
                                   head_sha=run.head_sha, models=["qwen35-tiny"]),
             render.check_output(run)["summary"]]
    for text in texts:
        assert mentions(text) == [], mentions(text)
        assert "decode@512" in text  # a gate name is no mention and stays as it was


def test_pr_text_cannot_become_a_link_or_a_reference():
    """GFM autolinks bare `https://…`, `www.…` and e-mail addresses, and GitHub links `#1`, `owner/repo#1` and
    `GH-1` (a cross-reference on that issue, in the bot's name): none may come out of the PR's error text."""
    run = hostile_failure(1)
    texts = [render.sticky_comment(current=run, earlier=[], awaiting_approval=False, approval_label="eval-approved",
                                   head_sha=run.head_sha, models=["qwen35-tiny"]),
             render.check_output(run)["summary"]]
    for text in texts:
        assert autolinks(text) == [], autolinks(text)
        assert "https:" in text and "evil.example" in text  # still readable


def test_pr_text_cannot_open_math():
    """GitHub renders `$…$` as LaTeX (after Markdown's backslash escapes, so safe_text's `\\\\` becomes `\\` again):
    `$\\Huge\\color{green}\\text{XL}$` in an error message would print a large green verdict in the bot's comment."""
    run = hostile_failure(1)
    text = render.sticky_comment(current=run, earlier=[], awaiting_approval=False, approval_label="eval-approved",
                                 head_sha=run.head_sha, models=["qwen35-tiny"])
    outside = re.sub(r"(`{3,})\n.*?\n\1", "", text, flags=re.S)  # the log's fenced block is code
    assert not re.search(r"(?<!\\)\$", outside), outside


def test_a_gate_reason_stays_in_its_table_cell():
    """The speed table printed a gate's `reason` raw (the guard table's is escaped): a `|` in it split the row, a
    `<!--` hid the rest of the comment. Reasons come from the worker; they are data all the same."""
    run = view(1, "infra", "e2f8dce0b2", state=EvalState.INFRA)
    run.result.gates[0].reason = "discarded | **XL** | <!-- hidden"
    text = render.sticky_comment(current=run, earlier=[], awaiting_approval=False, approval_label="eval-approved",
                                 head_sha=run.head_sha, models=["qwen35-tiny"])
    html = md_html(text)
    assert html.count("<!--") == 1 and html.startswith("<!-- tokengate:sticky -->"), html
    row = next(ln for ln in text.splitlines() if ln.startswith("| qwen35-tiny | decode@4096"))
    assert len(re.findall(r"(?<!\\)\|", row)) == 9, row  # 8 cells


def test_the_sticky_comment_fits_githubs_size_limit():
    """Eleven evaluations whose error text and log tails are made of characters that escaping lengthens (`<` →
    `&lt;`, `<!--` → `<!-\u200b-`) made a body GitHub refuses: the edit failed and the comment kept an older
    verdict. Earlier runs are left out (oldest first, saying so) until the body fits; the current one stays."""
    def worst(i: int) -> render.RunView:
        run = hostile_failure(i, "<" * 600)
        run.result.build_log_tail = "<!--" * 750
        return run
    current = worst(20)
    earlier = [worst(i) for i in range(19, 9, -1)]
    text = render.sticky_comment(current=current, earlier=earlier, awaiting_approval=False,
                                 approval_label="eval-approved", head_sha=current.head_sha, models=["qwen35-tiny"])
    assert len(text.encode("utf-16-le")) // 2 <= GITHUB_COMMENT_LIMIT, len(text)
    assert text.split("\n")[1] == f"### ❌ tokengate: `{render.verdict_label(Verdict.BUILD_FAILED)}` — `14eeeee`"
    shown = text.count("#### `")
    assert 0 < shown < 10 and f"{10 - shown} older not shown" in text, shown
    assert "#### `13eeeee`" in text and "#### `0aeeeee`" not in text  # the oldest went first


def test_every_pr_field_at_once_leaves_the_sticky_comment_structure_alone():
    """Held: PR text in each field the sticky comment prints (summary, INFRA detail, guard reason, build log,
    branch names), all at once. One HTML comment (the marker), our own headings and tables only, no image, no
    link but the dashboard's, nothing pinged."""
    from bot.settings import Settings, override_settings
    override_settings(Settings(public_base_url="https://tokengate.example.org"))
    try:
        infra = view(2, "infra", "e2f8dce0b2", state=EvalState.INFRA)
        infra.result.summary, infra.result.infra_detail = HOSTILE, HOSTILE
        infra.base_ref = "rel` <!-- " + HOSTILE
        slow = view(1, "slow", "8e7e027aa1")
        slow.result.guards[0].passed, slow.result.guards[0].reason = False, HOSTILE
        slow.result.summary = HOSTILE
        current = hostile_failure(3)
        current.base_ref = "a`b``c <!--"
        current.page_url = render.page_url(3)
        text = render.sticky_comment(current=current, earlier=[infra, slow], awaiting_approval=False,
                                     approval_label="eval-approved", head_sha=current.head_sha,
                                     models=["qwen35-tiny"])
        check = render.check_output(current)["summary"]
    finally:
        override_settings(None)
    html = md_html(text)
    assert html.count("<!--") == 1 and html.startswith("<!-- tokengate:sticky -->"), html
    assert re.findall(r"<h(\d)>", html) == ["3", "4", "4"], re.findall(r"<h\d>.*?</h\d>", html)
    assert "<img" not in html and re.findall(r'<a href="([^"]*)"', html) == ["https://tokengate.example.org/evaluations/3"]
    assert html.count("<table>") == 3  # the INFRA run's speed table, the slow run's correctness and speed tables
    assert mentions(text) == [] and mentions(check) == []
    assert "\u202e" not in text and "\u202e" not in check


def test_the_merge_commit_title_is_one_line_of_the_pr_title():
    """Held: the round's merge writes the PR title into main's history. Line breaks (a second line would start
    the commit body: trailers such as Signed-off-by), control and bidi characters are folded away, the length
    is capped, and our suffix stays last."""
    title = "faster decode\n\nSigned-off-by: Linus <l@k.org>\r\nCo-authored-by: x <x@y.z>\x1b[31m\u202e" + "x" * 500
    text = render.render("merge_commit_title.txt.j2", title=title, number=7).strip()
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\u202e" not in text, text
    assert text.startswith("faster decode Signed-off-by") and text.endswith(" (#7) [merge-first]")
    assert len(text) <= 200 + len(" (#7) [merge-first]") + 1
