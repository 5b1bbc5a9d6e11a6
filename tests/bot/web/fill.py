"""Fill the database the way the service does: real evaluations of the worker pipeline (CPU, the worker
tests' fake runtimes: base vs head in sandboxed processes, real receipts) stored through
`Service._store` and `bot.history.measure.store_result`, plus fast stand-in results where many points
are needed."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from bot.db.models import Evaluation, Installation, MainMeasurement, PullRequest, Repository, utcnow
from bot.enums import EvalState, Trigger
from bot.history.measure import store_result
from bot.service import Service
from tests.bot.conftest import INSTALLATION_ID
from worker.records import EvalResult


def real_result(tmp: Path, head_variant: str | None) -> EvalResult:
    """One evaluation by the real pipeline (checkout, sandbox, harness, gates, guards, receipt) on CPU."""
    from tests.worker.helpers import GOOD, fake_model, make_profile, make_repo, make_settings
    from worker.calibration.aa_store import AAStore
    from worker.pipeline import Job, evaluate
    tmp.mkdir(parents=True, exist_ok=True)
    repo = make_repo(tmp, head=head_variant)
    profile = make_profile(fake_model(tmp / "m.gguf"), pairs=3, inner=1, warmup=0, prompts_per_seed=1)
    return evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"), make_settings(profile),
                    trusted_root=GOOD, store=AAStore(tmp / "aa.sqlite"))


def repository(session, github, remote) -> Repository:
    state = github.repos["codertocat/hello-world"]
    session.merge(Installation(id=INSTALLATION_ID, account_login="Codertocat"))
    repo = Repository(id=state.id, installation_id=INSTALLATION_ID, full_name=state.full_name,
                      clone_url=remote.path.as_uri(), default_branch="main")
    session.add(repo)
    session.flush()
    return repo


def pr_evaluation(session, settings, repo: Repository, number: int, result: EvalResult, *, author="Codertocat",
                  state=EvalState.DONE, merged: bool = True, title: str | None = None) -> Evaluation:
    pr = PullRequest(repository_id=repo.id, number=number, title=title or f"PR {number}", author_login=author,
                     head_sha=result.head_sha, head_ref=f"pr{number}", base_ref="main", base_sha=result.base_sha,
                     is_open=not merged, html_url=f"https://github.com/{repo.full_name}/pull/{number}")
    session.add(pr)
    session.flush()
    created = utcnow() - timedelta(minutes=30)
    ev = Evaluation(pull_request_id=pr.id, head_sha=result.head_sha, base_sha=result.base_sha, base_ref="main",
                    state=state, trigger=Trigger.AUTO, requested_by=author, profile=result.profile, attempt=1,
                    created_at=created)
    session.add(ev)
    session.flush()
    if state in (EvalState.DONE, EvalState.INFRA):
        Service(settings)._store(ev, result)
        ev.started_at, ev.finished_at = created + timedelta(seconds=5), created + timedelta(minutes=1)
    if merged:
        main(session, repo, result, pr)
    session.flush()
    return ev


def main(session, repo: Repository, result: EvalResult, pr: PullRequest | None = None) -> MainMeasurement:
    m = MainMeasurement(repository_id=repo.id, kind="merge", sha=result.head_sha, base_sha=result.base_sha,
                        pull_request_id=pr.id if pr else None, state="queued", profile=result.profile)
    session.add(m)
    session.flush()
    store_result(m, result)
    session.flush()
    return m
