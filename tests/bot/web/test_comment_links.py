"""The sticky comment and the check run link to the evaluation page, and name the GPU, which model is
primary and which is guard, and each model's own tier."""
from __future__ import annotations

import pytest

from bot import render
from bot.settings import Settings, override_settings
from tests.bot.conftest import pr_payload, wait_until
from bot.testing.fake_evaluation import gate, guard, result_for
from tests.bot.helpers import evaluations, finished
from tests.bot.test_end_to_end import bot_comments


@pytest.fixture
def base_url():
    override_settings(Settings(public_base_url="https://tg.example.org/"))
    yield "https://tg.example.org"
    override_settings(None)


def view(result, eval_id=7):
    from tests.bot.render.render_examples import view as example_view
    v = example_view(1, "xl", result.head_sha)
    v.result, v.page_url = result, render.page_url(eval_id)
    return v


def test_primary_and_guard_each_with_its_tier_and_the_gpu(base_url):
    r = result_for("xl", repo="a/b", pr=1, base_sha="b" * 40, head_sha="h" * 40, speedup=0.17)
    r.gates.append(gate("qwen35-2b", "decode@512", 200.0, 0.3, scored=False))  # a guard's gates never score
    r.guards.append(guard("qwen35-2b"))
    r.receipt = {"host": {"gpu": {"name": "NVIDIA H200"}},
                 "models": {"qwen35-tiny": {"role": "primary"}, "qwen35-2b": {"role": "guard"}}}
    body = render.sticky_comment(current=view(r), earlier=[], awaiting_approval=False, approval_label="x",
                                 head_sha="h" * 40, models=[])
    assert "GPU: **NVIDIA H200**" in body
    assert "`qwen35-tiny` primary: **L**" in body and "`qwen35-2b` guard: passes" in body
    assert "(https://tg.example.org/evaluations/7)" in body
    summary = render.check_output(view(r))["summary"]
    assert "(https://tg.example.org/evaluations/7)" in summary and "`qwen35-2b` guard" in summary


def test_no_link_without_a_public_base_url():
    override_settings(Settings())
    try:
        assert render.page_url(7) is None
    finally:
        override_settings(None)


@pytest.mark.services
def test_the_real_flow_links_the_comment_to_the_page(settings, celery_worker, github, remote, send, client):
    override_settings(settings.model_copy(update={"public_base_url": "http://testserver"}))
    remote.commit("changes", "speed up decode (xl)")
    send("pull_request", pr_payload(github, remote, "opened"))
    wait_until(finished(1), what="the evaluation")
    (ev,) = evaluations()
    link = f"http://testserver/evaluations/{ev.id}"
    wait_until(lambda: link in bot_comments(github)[0]["body"], what="the link in the comment")
    assert link in github.check_runs[ev.check_run_id]["output"]["summary"]
    page = client.get(link)  # and the page it points at opens
    assert page.status_code == 200 and "NVIDIA H200" in page.text and "+45.2%" in page.text
