"""Small read-only views of the database and the fake GitHub for assertions."""
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
