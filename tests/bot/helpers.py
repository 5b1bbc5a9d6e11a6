"""Small read-only views of the database and the fake GitHub for assertions, and setups several tests share."""
from __future__ import annotations

from sqlalchemy import select

from bot.db.engine import session_scope
from bot.enums import EvalState
from bot.db.models import Delivery, Evaluation


def evaluations() -> list[Evaluation]:
    with session_scope() as s:
        return list(s.scalars(select(Evaluation).order_by(Evaluation.id)))


def finished(n: int = 1):
    """Predicate: at least n evaluations have left the queued/running states."""
    def check():
        evs = [e for e in evaluations() if not e.state.active]
        return evs if len(evs) >= n else None
    return check


def state_of(eval_id: int) -> EvalState:
    with session_scope() as s:
        return s.get(Evaluation, eval_id).state


def processed(delivery_id: str) -> Delivery | None:
    with session_scope() as s:
        d = s.get(Delivery, delivery_id)
        return d if d is not None and d.processed_at is not None else None


def gpu_sends(monkeypatch, refuse: int = 0, after: int = 0) -> tuple[list[str], list[str]]:
    """Watch the evaluation task's sends: (sent, refused) task ids. After `after` sends, the next `refuse` fail as
    a dead Redis makes them fail (after the commit that stored the attempt); every other message goes through."""
    from kombu.exceptions import OperationalError

    from bot.queue.app import celery_app
    from worker.queue.app import EVALUATE_TASK
    app = celery_app()
    real = app.send_task
    sent: list[str] = []
    refused: list[str] = []

    def send_task(name, *args, **kwargs):
        if name == EVALUATE_TASK:
            if len(sent) >= after and len(refused) < refuse:
                refused.append(kwargs.get("task_id"))
                raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
            sent.append(kwargs.get("task_id"))
        return real(name, *args, **kwargs)
    monkeypatch.setattr(app, "send_task", send_task)
    return sent, refused


def two_measured_prs_and_a_due_round(github, remote, send) -> None:
    """#2 (+45 %) and #3 (+60 %) opened and measured against main; the round's window has ended."""
    from sqlalchemy import update

    from bot.db.models import Round, utcnow
    from tests.bot.conftest import pr_payload, wait_until
    for number, branch, message in ((2, "a", "fast (xl:45)"), (3, "b", "faster (xl:60)")):
        remote.commit(branch, message)
        send("pull_request", pr_payload(github, remote, "opened", number=number, head_ref=branch))
        wait_until(finished(number - 1), what=f"evaluation of #{number}")
    with session_scope() as s:
        s.execute(update(Round).values(closes_at=utcnow()))  # the window has ended


def stored_not_handled(send, monkeypatch, event: str, payload: dict) -> str:
    """Send a delivery the web request stores but hands to no handle task (its drain kick lost); its id."""
    from bot.queue import kick
    with monkeypatch.context() as stored_only:
        stored_only.setattr(kick.DrainKicker, "kick", lambda self: None)
        stored_only.setattr(kick.kicker(), "healthy", True)
        return send(event, payload).json()["delivery"]
