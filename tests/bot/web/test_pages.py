"""Every dashboard page rendered from a database filled by real evaluations; numbers checked against
the receipts; escaping, private repositories, the queue's positions and the hosts' drift attacked."""
from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from bot.db.engine import session_scope
from bot.db.models import Evaluation, Receipt, RepositoryVisibility, utcnow
from bot.enums import EvalState
from bot.render import num
from bot.testing.fake_evaluation import result_for
from tests.bot.web import fill
from tests.bot.web.conftest import MAIN_POINTS, receipt_median

pytestmark = pytest.mark.services


def points_in(html: str, section_id: str) -> int:
    section = html.split(f'id="{section_id}"', 1)[1].split("</section>", 1)[0]
    return section.count('class="point"')


@pytest.mark.sandbox
def test_overview_shows_latest_main_per_gate_from_the_receipts(client, filled):
    html = client.get(f"/repos/{filled.repo_name}").text
    # the latest main commit of each real gate is the "slow" evaluation's head: its receipt's median
    slow = filled.results["slow"]
    for gate in ("decode@32", "prefill@64"):
        assert num(receipt_median(slow, gate)) in html
    assert "real slow" in html and "REJECT" in html and "XL" in html


@pytest.mark.sandbox
def test_evaluation_page_numbers_match_the_receipt(client, filled):
    r = client.get(f"/evaluations/{filled.eval_ids['none']}")
    assert r.status_code == 200
    result = filled.results["none"]
    for g in result.gates:
        assert num(receipt_median(result, g.gate, "head")) in r.text
        assert num(receipt_median(result, g.gate, "base")) in r.text
    assert "none (CPU evaluation)" in r.text  # the GPU line says why there is none
    assert result.receipt["revisions"]["head"]["sha"] in r.text  # provenance
    assert "load fake (head)" in r.text  # per-phase times from the receipt
    got = client.get(f"/evaluations/{filled.eval_ids['none']}/receipt.json")
    assert "attachment" in got.headers["content-disposition"]
    with session_scope() as session:
        assert got.json() == session.query(Receipt).filter_by(evaluation_id=filled.eval_ids["none"]).one().data


def test_logs_are_escaped(client, settings, filled):
    with session_scope() as session:
        ev = session.get(Evaluation, filled.eval_ids["slow"])
        bad = result_for("infra", repo=filled.repo_name, pr=11, base_sha=ev.base_sha, head_sha=ev.head_sha)
        bad.infra_detail = '<script>alert("pwned")</script>'
        bad.build_log_tail = "<img src=x onerror=alert(1)>"
        ev.result = bad.to_dict()
    html = client.get(f"/evaluations/{filled.eval_ids['slow']}").text
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;" in html


@pytest.mark.sandbox
def test_history_plots_every_main_commit_with_a_link(client, filled):
    html = client.get(f"/repos/{filled.repo_name}/history").text
    assert points_in(html, "qwen35-tiny-decode@512") == MAIN_POINTS + 1  # + the merged win
    assert points_in(html, "qwen35-tiny-decode@4096") == 1
    assert points_in(html, "fake-decode@32") == 2  # the two real evaluations' heads
    links = re.findall(r'<a href="(/measurements/\d+)"><circle class="point"', html)
    # 8 + 1 + 1 (qwen35-tiny's three gates) + 4 × 2 (the real gates) + 2 (memory: the real receipts)
    assert len(links) == 20
    assert client.get(links[0]).status_code == 200
    only = client.get(f"/repos/{filled.repo_name}/history", params={"model": "fake", "gate": "decode@32"}).text
    assert "qwen35-tiny-decode@512" not in only and points_in(only, "fake-decode@32") == 2


@pytest.mark.sandbox
def test_history_memory_plot_is_the_receipts_peak_rss(client, filled):
    html = client.get(f"/repos/{filled.repo_name}/history").text
    rss = filled.results["slow"].receipt["processes"]["head"]["max_rss_bytes"]
    assert f"{rss / 2**20:,.1f} MiB (rss)" in html
    assert "RSS on CPU evaluations" in html


def test_journey_lists_the_merged_win_with_its_author(client, filled):
    html = client.get(f"/repos/{filled.repo_name}/journey").text
    assert "faster decode" in html and "speedy" in html and "+25.0%" in html
    assert "real none" not in html  # a NONE verdict is no win
    assert html.count('class="point"') >= 1


def test_queue_positions_and_eta_from_measured_durations(client, settings, filled):
    with session_scope() as session:
        done = session.get(Evaluation, filled.eval_ids["none"])
        repo = done.pull_request.repository
        waiting = []
        for n in (30, 31):
            r = result_for("none", repo=repo.full_name, pr=n, base_sha="c" * 40, head_sha=f"{n:040x}")
            waiting.append(fill.pr_evaluation(session, settings, repo, n, r, state=EvalState.QUEUED, merged=False))
        for ev in session.query(Evaluation).filter(Evaluation.state == EvalState.DONE):
            ev.duration_s, ev.finished_at = 600.0, utcnow()
    html = client.get("/queue").text
    rows = re.findall(r'<td class="n position">(\d+)</td><td><a href="/evaluations/(\d+)"', html)
    assert rows == [("1", str(waiting[0].id)), ("2", str(waiting[1].id))]
    assert "10 min 00 s (median run 10 min 00 s)" in html and "20 min 00 s" in html


def test_hosts_show_calibration_and_raise_a_drift_alarm(client, settings, filled):
    html = client.get("/hosts").text
    host_key = filled.results["none"].receipt["host_key"]
    assert host_key in html and "not calibrated" in html and "drift" not in html.split("<h1>")[1].split("</p>")[1]
    with session_scope() as session:
        for i, floor in enumerate((0.01, 0.011, 0.05)):
            r = result_for("none", repo=filled.repo_name, pr=40 + i, base_sha="d" * 40, head_sha=f"{40 + i:040x}")
            r.receipt = {"host_key": "gpu-box-7/cuda/NVIDIA H200", "host": {"gpu": {"name": "NVIDIA H200"}},
                         "models": {"qwen35-tiny": {"noise_floors": {"decode@512": {
                             "floor": floor, "calibrated": True, "aa_deltas": 40, "bound": 1e-4}}}}}
            ev = fill.pr_evaluation(session, settings, session.get(Evaluation, filled.eval_ids["none"])
                                    .pull_request.repository, 40 + i, r, merged=False)
            ev.receipt.created_at = utcnow() + timedelta(seconds=i)
    html = client.get("/hosts").text
    box = html.split("gpu-box-7/cuda/NVIDIA H200", 1)[1].split("</section>", 1)[0]
    assert "NVIDIA H200" in box and "drift on 1 gate(s)" in box and "calibrated" in box


def test_private_repositories_are_off_by_default(client, settings, filled):
    with session_scope() as session:
        ev = session.get(Evaluation, filled.eval_ids["none"])
        session.merge(RepositoryVisibility(repository_id=ev.pull_request.repository_id, private=True))
    assert client.get(f"/repos/{filled.repo_name}").status_code == 404
    assert client.get(f"/evaluations/{filled.eval_ids['none']}").status_code == 404
    assert client.get(f"/evaluations/{filled.eval_ids['none']}/receipt.json").status_code == 404
    assert filled.repo_name not in client.get("/").text
    from bot.settings import override_settings
    override_settings(settings.model_copy(update={"dashboard_private": "show"}))
    assert client.get(f"/repos/{filled.repo_name}").status_code == 200


def test_visibility_is_asked_of_github_once(client, github, filled):
    assert client.get(f"/repos/{filled.repo_name}").status_code == 200
    with session_scope() as session:
        rows = session.query(RepositoryVisibility).all()
        assert [r.private for r in rows] == [False]


def test_unknown_visibility_fails_closed(client, settings, filled):
    """No installation to ask, or GitHub unreachable: treated as private, and asked again next time."""
    from bot.db.models import Repository
    from bot.github.client import reset_github_app
    from bot.settings import override_settings
    override_settings(settings.model_copy(update={"github_api_url": "http://127.0.0.1:9"}))  # nothing listens
    reset_github_app()
    assert client.get(f"/repos/{filled.repo_name}").status_code == 404
    with session_scope() as session:
        assert session.query(RepositoryVisibility).count() == 0  # not remembered: asked again next time
    override_settings(settings)
    reset_github_app()
    with session_scope() as session:
        session.query(Repository).one().installation_id = None
    assert client.get(f"/repos/{filled.repo_name}").status_code == 404


def test_history_plots_one_series_per_device_model(client, filled):
    """A gate measured on two device models is two series (absolute tok/s of different GPUs are not one history:
    the change-point job scans them apart, bot/history/job.py by_machine), each named by its machine."""
    from bot.web.views import repo_by_name
    with session_scope() as session:
        repo = repo_by_name(session, filled.repo_name)
        for i in range(3):
            r = result_for("none", repo=repo.full_name, pr=None, base_sha=f"{100 + i:040x}", head_sha=f"{101 + i:040x}")
            r.receipt = {**(r.receipt or {}), "host": {"gpu": {"name": "NVIDIA H100 PCIe"}}}
            fill.main(session, repo, r)
    html = client.get(f"/repos/{filled.repo_name}/history").text
    assert points_in(html, "qwen35-tiny-decode@512") == MAIN_POINTS + 1  # the first machine's series, as before
    assert points_in(html, "qwen35-tiny-decode@512-2") == 3
    assert "NVIDIA H100 PCIe" in html
