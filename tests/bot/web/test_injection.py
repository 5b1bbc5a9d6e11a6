"""The dashboard attacked: a hostile PR's text in every field a page shows (HTML and SVG, in Chromium too),
route parameters that are patterns or paths, and who may see a repository that went private."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest

from bot.db.engine import session_scope
from bot.db.models import (ChangePoint, Evaluation, MainMeasurement, PullRequest, Receipt, RepositoryVisibility,
                           utcnow)
from bot.enums import EvalState
from bot.testing.fake_evaluation import result_for
from tests.bot.web.test_browser import browser, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.services

X = ('"\'><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"><svg onload="window.__pwned=3">'
     '<a href="javascript:window.__pwned=4">x</a> @everyone')
INJECTED = re.compile(r"<script|<img|<svg onload|<a href=\"javascript|onerror=\"|onload=\"", re.I)


def hostile(filled) -> dict[str, str]:
    """The PR's text in every field the pages print; returns the pages to load."""
    with session_scope() as session:
        ev = session.get(Evaluation, filled.eval_ids["slow"])
        pr = ev.pull_request
        pr.title, pr.author_login, pr.head_ref, pr.base_ref = X, X[:255], X, X
        ev.base_ref, ev.requested_by, ev.worker_host = X, X, X
        bad = result_for("slow", repo=filled.repo_name, pr=pr.number, base_sha=ev.base_sha, head_sha=ev.head_sha)
        bad.summary = bad.guards[0].reason = bad.gates[1].reason = bad.infra_detail = bad.build_log_tail = X
        bad.guards[0].passed = False
        receipt = {"host_key": X, "host": {"gpu": {"name": X}, "versions": {"runtime": X}},
                   "revisions": {"head": {"sha": ev.head_sha, "ref": X}},
                   "processes": {"head": {"hello": {"load_seconds": {X: 1.0}}}},
                   "models": {X: {"gguf_sha256": X, "role": X, "wall_seconds": {X: [[1.0, 2.0]]},
                                  "noise_floors": {X: {"floor": 0.01, "calibrated": True}}}}}
        bad.receipt = receipt
        ev.result = bad.to_dict()
        ev.receipt.data = receipt
        win = session.get(Evaluation, filled.eval_ids["xl"])
        win.pull_request.title, win.pull_request.author_login = X, X
        running = session.get(Evaluation, filled.eval_ids["none"])
        running.state, running.worker_host, running.result = EvalState.RUNNING, X, None
        m = session.get(MainMeasurement, filled.main_ids[-1])
        m.detail = X
        failed = result_for("none", repo=filled.repo_name, pr=None, base_sha=m.base_sha, head_sha=m.sha)
        failed.summary, failed.receipt = X, receipt
        m.result = failed.to_dict()
        session.add(ChangePoint(repository_id=m.repository_id, model="qwen35-tiny", gate="decode@512", sha=m.sha,
                                previous_sha=m.base_sha, rel_step=-0.05, false_alarm_rate=0.01, state="unresolved",
                                good_sha=m.base_sha, bad_sha=m.sha, detail=X))
        repo = filled.repo_name
    return {"index": "/", "overview": f"/repos/{repo}", "history": f"/repos/{repo}/history?model={X}&gate={X}",
            "history-all": f"/repos/{repo}/history", "journey": f"/repos/{repo}/journey",
            "evaluation": f"/evaluations/{filled.eval_ids['slow']}", "measurement": f"/measurements/{filled.main_ids[-1]}",
            "queue": "/queue", "hosts": "/hosts"}


def test_pr_text_on_every_page_is_text(client, filled):
    """Held: title, author, branch names, the fault's text, the log, the reasons, the change point's detail and the
    receipt's strings are escaped on every page — in HTML, in attributes and in the SVG plots' titles."""
    pages = hostile(filled)
    for name, path in pages.items():
        r = client.get(path)
        assert r.status_code == 200, (name, r.status_code)
        assert not INJECTED.search(r.text), (name, INJECTED.search(r.text), r.text[INJECTED.search(r.text).start() - 200:][:400])
        assert "&lt;script&gt;" in r.text or name in ("index", "history-all"), name  # it is there, as text
    svg = client.get(pages["journey"]).text.split("<svg", 1)[1]
    assert "&lt;script&gt;" in svg  # the author in a point's <title>


def test_pr_text_on_every_page_runs_nothing_in_chromium(browser, server, filled):  # noqa: F811
    """Held, in a real browser: nothing the PR wrote runs on any page."""
    pages = hostile(filled)
    for name, path in pages.items():
        browser.get(server + path)
        assert "tokengate" in browser.title, name
        assert browser.execute_script("return window.__pwned === undefined") is True, name
        assert browser.execute_script("return document.querySelectorAll('script, img, a[href^=javascript]').length") == 0


def test_a_repository_made_private_is_hidden_once_its_visibility_is_rechecked(client, github, filled, monkeypatch):
    """The answer to "is it private?" was kept forever: a repository made private after its first page view was
    shown to anyone from then on. An answer older than access.RECHECK_S is asked again."""
    from bot.web import access
    assert client.get(f"/repos/{filled.repo_name}").status_code == 200  # public: remembered
    monkeypatch.setattr(github, "_repo_json", lambda repo, _json=github._repo_json: {**_json(repo), "private": True})
    assert client.get(f"/repos/{filled.repo_name}").status_code == 200  # within RECHECK_S: not asked again
    with session_scope() as session:
        for row in session.query(RepositoryVisibility):
            row.checked_at = utcnow() - timedelta(seconds=getattr(access, "RECHECK_S", 3600) + 1)
    assert client.get(f"/repos/{filled.repo_name}").status_code == 404
    assert client.get(f"/evaluations/{filled.eval_ids['none']}").status_code == 404
    assert client.get(f"/evaluations/{filled.eval_ids['none']}/receipt.json").status_code == 404
    assert filled.repo_name not in client.get("/").text
    with session_scope() as session:
        assert [r.private for r in session.query(RepositoryVisibility)] == [True]


def test_a_stale_visibility_github_cannot_confirm_fails_closed(client, settings, filled):
    """GitHub unreachable when a remembered answer is due again: treated as private, like an unknown one."""
    from bot.github.client import reset_github_app
    from bot.settings import override_settings
    from bot.web import access
    assert client.get(f"/repos/{filled.repo_name}").status_code == 200
    with session_scope() as session:
        for row in session.query(RepositoryVisibility):
            row.checked_at = utcnow() - timedelta(seconds=getattr(access, "RECHECK_S", 3600) + 1)
    override_settings(settings.model_copy(update={"github_api_url": "http://127.0.0.1:9"}))  # nothing listens
    reset_github_app()
    assert client.get(f"/repos/{filled.repo_name}").status_code == 404


def test_like_wildcards_in_a_repository_path_match_nothing(client, filled):
    """`/repos/{owner}/{name}` was looked up with ILIKE: `%` and `_` are patterns there, so `/repos/%25/%25` or
    `/repos/Codertocat/Hello_World` showed some repository under a name it does not have."""
    owner, name = filled.repo_name.split("/")
    assert client.get(f"/repos/{owner.upper()}/{name.lower()}").status_code == 200  # GitHub names: any case
    for path in ("/repos/%25/%25", f"/repos/{owner}/%25", f"/repos/{owner}/{name[:-1]}_",
                 f"/repos/{owner}/{name.replace('-', '_')}", f"/repos/%25/{name}/history", f"/repos/{owner}/%25/journey"):
        assert client.get(path).status_code == 404, path


def test_route_parameters_neither_traverse_nor_redirect_off_site(client, filled):
    """Held: dot segments and encoded slashes in a path find no other page, and no path redirects to another host."""
    for path in ("/repos/../../etc/passwd", "/repos/%2e%2e/%2e%2e/queue", f"/repos/{filled.repo_name}%2F..%2F..",
                 "/evaluations/..%2F1", "/evaluations/1%2F..%2F..%2Fhosts", "/measurements/-1"):
        r = client.get(path, follow_redirects=False)
        assert r.status_code in (404, 422), (path, r.status_code)
    for path in ("//evil.example/", "//evil.example/queue/", "/queue/", "/\\evil.example/", f"/repos/{filled.repo_name}/"):
        r = client.get(path, follow_redirects=False)
        location = r.headers.get("location", "")
        assert not location or location.startswith(("/", "http://testserver/")), (path, location)


def test_a_private_repositorys_rows_are_on_no_page(client, settings, filled):
    """Held: besides its own pages and receipts (test_pages.py), a private repository's queued and running
    evaluations leave the shared queue page, and its main measurements and their receipts answer 404."""
    with session_scope() as session:
        ev = session.get(Evaluation, filled.eval_ids["none"])
        ev.state, ev.worker_host, ev.result = EvalState.RUNNING, "gpu-box-secret", None
        queued = session.get(Evaluation, filled.eval_ids["slow"])
        queued.state, queued.result = EvalState.QUEUED, None
        m = session.get(MainMeasurement, filled.main_ids[0])
        m.state = "queued"
        repo_id = ev.pull_request.repository_id
    html = client.get("/queue").text
    assert f"/evaluations/{filled.eval_ids['none']}" in html and "gpu-box-secret" in html  # public: listed
    with session_scope() as session:
        session.merge(RepositoryVisibility(repository_id=repo_id, private=True))
    html = client.get("/queue").text
    assert filled.repo_name not in html and "gpu-box-secret" not in html
    assert "/evaluations/" not in html and "/measurements/" not in html
    for path in (f"/measurements/{filled.main_ids[-1]}", f"/measurements/{filled.main_ids[-1]}/receipt.json",
                 f"/evaluations/{filled.eval_ids['xl']}", f"/repos/{filled.repo_name}/history",
                 f"/repos/{filled.repo_name}/journey"):
        assert client.get(path).status_code == 404, path


@pytest.mark.sandbox
def test_a_hello_with_non_numbers_for_load_seconds_does_not_break_the_evaluation_page(client, filled):
    """The receipt keeps each revision's hello as its runtime sent it (worker/pipeline.py: the harness adds its own
    load times to the runtime's `load_seconds` dict): the head's runtime put a string there, and the page's phase
    table formatted it with "%.3f" — a 500 instead of the evaluation's page."""
    with session_scope() as session:
        ev = session.get(Evaluation, filled.eval_ids["slow"])
        data = dict(ev.receipt.data)
        data["processes"] = {**data["processes"], "head": {**data["processes"]["head"], "hello": {
            "protocol": 1, "load_seconds": {"fake": 0.25, "x": "not a number", "y": [1.0], "z": True}}}}
        ev.receipt.data = data
        result = dict(ev.result)
        result["receipt"] = data
        ev.result = result
    r = client.get(f"/evaluations/{filled.eval_ids['slow']}")
    assert r.status_code == 200, r.status_code
    phases = r.text.split('<table class="phases">', 1)[1].split("</table>", 1)[0]
    assert "<td>load fake (head)</td><td class=\"n\">0.250 s</td>" in phases
    assert "<td>load x (head)</td><td class=\"n\">n/a</td>" in phases and "<td>load z (head)</td><td class=\"n\">n/a</td>" in phases
