"""Who is to blame, confirmed: one retry before a head fault becomes the PR's failure verdict, and
no tier for a head whose evaluation had a failed attempt.

- A provisional head fault (EvalResult.failure set, worker/verdicts/faults.py) is run once more from scratch.
  Failing again (the head, whatever the kind) → REJECT, the comment saying what failed where on
  both attempts. An INFRA second attempt is returned as INFRA. A clean second attempt means the
  head failed once and then ran: its measurement stands, but it cannot earn a tier (WITHHELD).
- Any earlier attempt of this evaluation that was INFRA (the bot re-dispatches those with
  attempt + 1) or a head fault blocks a tier for that head until a clean evaluation.
"""
from __future__ import annotations

from typing import Callable

from worker.records import TIERS, EvalResult, Verdict


def confirm_head_fault(first: EvalResult, rerun: Callable[[], EvalResult], enabled: bool = True) -> EvalResult:
    if first.failure is None or first.verdict is not Verdict.REJECT or not enabled:
        return first
    second = rerun()
    f1 = first.failure
    said1 = f"attempt 1: {f1['what']} ({f1['model']}, {f1['phase']}: {f1['detail'][:200]})"
    if second.failure is not None:
        f2 = second.failure
        second.failure = {**f2, "attempts": 2, "first": f1}
        second.summary = (f"Rejected: the PR's code failed on both attempts, where the baseline ran the same work "
                          f"fine on this box. {said1}; attempt 2: {f2['what']} ({f2['model']}, {f2['phase']}: "
                          f"{f2['detail'][:200]}).")
        return second
    second.notes = [*second.notes, f"{said1}; the confirming attempt ran without that failure"]
    if second.verdict is Verdict.INFRA:
        return second
    return withhold_tier(second, said1)


def withhold_tier(r: EvalResult, why: str) -> EvalResult:
    if r.verdict in TIERS:
        r.summary = (f"Tier withheld ({r.verdict.value} was measured): an earlier attempt of this evaluation "
                     f"failed ({why}); a clean evaluation is needed for a tier. {r.summary}")
        r.verdict = Verdict.WITHHELD
    return r


def block_after_failed_attempts(r: EvalResult, attempt: int, history: list[str] | None = None) -> EvalResult:
    """The bot re-dispatches only INFRA attempts, so attempt > 1 means an earlier attempt failed."""
    if attempt > 1 or history:
        why = "; ".join(history or []) or f"{attempt - 1} earlier attempt(s) ended INFRA"
        r.notes = [*r.notes, f"earlier attempts: {why}"]
        return withhold_tier(r, why)
    return r
