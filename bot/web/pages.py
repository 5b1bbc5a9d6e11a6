"""The dashboard: server-rendered HTML pages (templates/web/), readable without JavaScript.

Routes: `/` repositories · `/repos/{owner}/{name}` overview · `…/history` main per gate ·
`…/journey` merged wins · `/evaluations/{id}` (+ `/receipt.json`) · `/measurements/{id}` a main
measurement (+ `/receipt.json`) · `/queue` · `/hosts`. Private repositories: see bot/web/access.py.
"""
from __future__ import annotations

import functools
import json

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from sqlalchemy import select

from bot import render as words
from bot.db.engine import session_scope
from bot.db.models import Evaluation, MainMeasurement, PullRequest, Repository
from bot.settings import get_settings
from bot.web import access, views
from worker.records import EvalResult

router = APIRouter()


@functools.lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader([words.TEMPLATES_DIR / "web", words.TEMPLATES_DIR]), undefined=StrictUndefined,
                      autoescape=select_autoescape(["html", "j2"], default=True), trim_blocks=True, lstrip_blocks=True)
    env.filters.update(pct=words.pct, percent=words.percent, num=words.num, short=words.short,
                       duration=words.duration, mib=lambda b: "n/a" if b is None else f"{b / 2**20:,.1f} MiB")
    env.globals.update(icon=words.VERDICT_ICON, eval_url=views.eval_url, measurement_url=views.measurement_url)
    return env


def page(template: str, **context) -> HTMLResponse:
    return HTMLResponse(environment().get_template(template).render(**context))


def _repo(session, owner: str, name: str) -> Repository:
    repo = views.repo_by_name(session, f"{owner}/{name}")
    if repo is None or not access.may_view(session, get_settings(), repo):
        raise HTTPException(404, "no such repository here (private repositories are not shown)")
    return repo


def _viewable(session, repo_id: int) -> None:
    repo = session.get(Repository, repo_id)
    if repo is None or not access.may_view(session, get_settings(), repo):
        raise HTTPException(404, "not found (private repositories are not shown)")


@router.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    with session_scope() as session:
        repos = [r for r in session.scalars(select(Repository).order_by(Repository.full_name))
                 if access.may_view(session, get_settings(), r)]
        return page("index.html.j2", repos=repos)


@router.get("/repos/{owner}/{name}", response_class=HTMLResponse)
def overview(owner: str, name: str) -> HTMLResponse:
    with session_scope() as session:
        repo = _repo(session, owner, name)
        return page("overview.html.j2", repo=repo, **views.overview(session, repo))


@router.get("/repos/{owner}/{name}/history", response_class=HTMLResponse)
def history(owner: str, name: str, model: str | None = None, gate: str | None = None) -> HTMLResponse:
    with session_scope() as session:
        repo = _repo(session, owner, name)
        return page("history.html.j2", repo=repo, model=model, gate=gate, **views.history(session, repo, model, gate))


@router.get("/repos/{owner}/{name}/journey", response_class=HTMLResponse)
def journey(owner: str, name: str) -> HTMLResponse:
    with session_scope() as session:
        repo = _repo(session, owner, name)
        return page("journey.html.j2", repo=repo, **views.journey(session, repo))


@router.get("/evaluations/{eval_id}", response_class=HTMLResponse)
def evaluation(eval_id: int) -> HTMLResponse:
    with session_scope() as session:
        ev = session.get(Evaluation, eval_id)
        if ev is None:
            raise HTTPException(404, "no such evaluation")
        pr: PullRequest = ev.pull_request
        _viewable(session, pr.repository_id)
        result = EvalResult.from_dict(ev.result) if ev.result else None
        receipt = ev.receipt.data if ev.receipt else (result.receipt if result else {})
        return page("evaluation.html.j2", kind="evaluation", ev=ev, pr=pr, repo=pr.repository, result=result,
                    receipt=receipt, phases=views.phases(ev, result), provenance=views.provenance(receipt),
                    gpu=views.gpu_of(receipt), receipt_url=f"/evaluations/{ev.id}/receipt.json")


@router.get("/measurements/{m_id}", response_class=HTMLResponse)
def measurement(m_id: int) -> HTMLResponse:
    with session_scope() as session:
        m = session.get(MainMeasurement, m_id)
        if m is None:
            raise HTTPException(404, "no such measurement")
        _viewable(session, m.repository_id)
        result = EvalResult.from_dict(m.result) if m.result else None
        receipt = result.receipt if result else {}
        return page("evaluation.html.j2", kind="measurement", ev=m, pr=m.pull_request, repo=m.repository,
                    result=result, receipt=receipt, phases=views.phases(m, result),
                    provenance=views.provenance(receipt), gpu=views.gpu_of(receipt),
                    receipt_url=f"/measurements/{m.id}/receipt.json")


def _download(data: dict, name: str) -> Response:
    return Response(json.dumps(data, indent=2, sort_keys=True), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/evaluations/{eval_id}/receipt.json")
def evaluation_receipt(eval_id: int) -> Response:
    with session_scope() as session:
        ev = session.get(Evaluation, eval_id)
        if ev is None or ev.receipt is None:
            raise HTTPException(404, "no receipt for this evaluation")
        _viewable(session, ev.pull_request.repository_id)
        return _download(ev.receipt.data, f"tokengate-evaluation-{ev.id}-receipt.json")


@router.get("/measurements/{m_id}/receipt.json")
def measurement_receipt(m_id: int) -> Response:
    with session_scope() as session:
        m = session.get(MainMeasurement, m_id)
        if m is None or not m.result or not m.result.get("receipt"):
            raise HTTPException(404, "no receipt for this measurement")
        _viewable(session, m.repository_id)
        return _download(m.result["receipt"], f"tokengate-main-{m.id}-receipt.json")


@router.get("/queue", response_class=HTMLResponse)
def queue() -> HTMLResponse:
    with session_scope() as session:
        q = views.queue(session, get_settings().gpu_workers)
        ok = {r.id for r in session.scalars(select(Repository)) if access.may_view(session, get_settings(), r)}
        q["running"] = [r for r in q["running"] if r[0].pull_request.repository_id in ok]
        q["waiting"] = [r for r in q["waiting"] if r[0].pull_request.repository_id in ok]
        q["main"] = [m for m in q["main"] if m.repository_id in ok]
        return page("queue.html.j2", **q)


@router.get("/hosts", response_class=HTMLResponse)
def hosts() -> HTMLResponse:
    with session_scope() as session:
        return page("hosts.html.j2", hosts=views.hosts(session), drift_ratio=views.DRIFT_RATIO)
