"""Issue 15, item 3: a result counts only under the key of the GPU worker the attempt is bound to — the
first whose signed claim (or signed result) the bot saw — with the real PostgreSQL, Redis and worker."""
from __future__ import annotations

import pytest
import redis

from bot import metrics
from bot.db.engine import session_scope
from bot.db.models import Evaluation
from bot.enums import EvalState
from bot.queue.app import celery_app
from tests.bot.conftest import WORKER_ID, pr_payload, wait_until
from bot.testing.fake_evaluation import result_for
from tests.bot.helpers import evaluations, processed
from tests.bot.queue.test_watchdog import open_pr, quiet_celery  # noqa: F401  (a fixture)
from worker.queue.auth import RESULT_AUTH, claim_mac, result_mac

pytestmark = pytest.mark.services

OTHER, OTHER_KEY = "gpu9", "gpu9-own-key"  # a second, genuine GPU worker: its key is known to the bot


def rejected(counter, reason: str) -> float:
    return counter.labels(reason)._value.get()


def signed_by(worker: str, key: str, result: dict, ev: Evaluation) -> dict:
    return {**result, RESULT_AUTH: {"worker": worker, "mac": result_mac(key, result, ev.id, ev.celery_task_id)}}


def publish(result: dict, ev: Evaluation) -> str:
    return celery_app().send_task("tokengate.publish_result", args=[result, ev.id, ev.celery_task_id],
                                  queue="publish").get(timeout=20)


def claim(worker: str, key: str, ev: Evaluation) -> str:
    return celery_app().send_task("tokengate.evaluation_started", args=[
        ev.id, f"{worker}@box", ev.celery_task_id, {"worker": worker, "mac": claim_mac(key, ev.id, ev.celery_task_id)}],
        queue="publish").get(timeout=20)


def test_a_result_signed_by_another_workers_key_is_refused(settings, celery_worker, github, remote, send):
    settings.worker_keys = {**settings.worker_keys, OTHER: OTHER_KEY}
    remote.commit("changes", "block until released")
    d = send("pull_request", pr_payload(github, remote, "opened")).json()["delivery"]
    wait_until(lambda: processed(d) and evaluations(), what="evaluation dispatched")
    # The in-process GPU worker takes it and sends its signed claim: the attempt is bound to it, durably.
    wait_until(lambda: evaluations()[0].claimed_by == WORKER_ID and evaluations()[0].state is EvalState.RUNNING,
               what="attempt claimed")
    (ev,) = evaluations()
    xl = result_for("xl", repo="Codertocat/Hello-World", pr=2, base_sha=ev.base_sha, head_sha=ev.head_sha).to_dict()

    before = rejected(metrics.RESULTS_REJECTED, "other_worker")
    out = publish(signed_by(OTHER, OTHER_KEY, xl, ev), ev)  # a valid signature, but not the claimant's
    assert "bound to worker test-gpu" in out and "refused" in out, out
    assert rejected(metrics.RESULTS_REJECTED, "other_worker") == before + 1
    assert evaluations()[0].state.active and evaluations()[0].verdict is None
    # Nor can the other worker take the attempt over with a claim of its own.
    claims_before = rejected(metrics.CLAIMS_REJECTED, "other_worker")
    assert "refused" in claim(OTHER, OTHER_KEY, ev)
    assert rejected(metrics.CLAIMS_REJECTED, "other_worker") == claims_before + 1
    assert evaluations()[0].claimed_by == WORKER_ID
    # The claimant's own result lands.
    redis.Redis.from_url(settings.broker_url).set(
        f"{settings.redis_key_prefix}tokengate:result:release:{ev.head_sha}", 1, ex=60)
    wait_until(lambda: not evaluations()[0].state.active, what="the claimant's result")
    assert (evaluations()[0].verdict, evaluations()[0].result_worker) == ("XL", WORKER_ID)


def test_an_unsigned_claim_binds_nothing_and_the_first_signed_message_binds_the_attempt(settings, service_ev):
    service, ev = service_ev
    settings.worker_keys = {**settings.worker_keys, OTHER: OTHER_KEY}
    with session_scope() as s:  # a claim from someone holding only the broker URL: no key, no effect
        out = service.evaluation_started(s, ev.id, "x@box", ev.celery_task_id, {"worker": OTHER, "mac": "0" * 64})
    assert "not signed" in out
    assert _row(ev.id).claimed_by is None and _row(ev.id).state is EvalState.QUEUED
    # A signed result that reaches the bot before its worker's claim binds the attempt to that worker ...
    xl = result_for("xl", repo="Codertocat/Hello-World", pr=2, base_sha=ev.base_sha, head_sha=ev.head_sha).to_dict()
    with session_scope() as s:
        service.publish_result(s, signed_by(OTHER, OTHER_KEY, xl, ev), ev.id, ev.celery_task_id)
    assert _row(ev.id).claimed_by == OTHER and _row(ev.id).result_worker == OTHER


def _row(eval_id: int) -> Evaluation:
    with session_scope() as s:
        return s.get(Evaluation, eval_id)


@pytest.fixture
def service_ev(settings, github, remote, quiet_celery):
    """An evaluation dispatched to a broker nothing consumes: only this test's messages reach the bot."""
    from bot.service import Service
    service = Service(settings, celery=quiet_celery[0])
    return service, open_pr(service, github, remote)
