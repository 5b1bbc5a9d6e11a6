"""Every state, label and command name the service uses (wording lives in templates/)."""
from __future__ import annotations

from enum import Enum

from worker.records import Verdict


class EvalState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    INFRA = "infra"  # gave up after the automatic retries
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"

    @property
    def active(self) -> bool:
        return self in (EvalState.QUEUED, EvalState.RUNNING)


# Allowed transitions of the evaluation state machine.
TRANSITIONS: dict[EvalState, set[EvalState]] = {
    EvalState.QUEUED: {EvalState.RUNNING, EvalState.DONE, EvalState.INFRA, EvalState.CANCELLED, EvalState.SUPERSEDED,
                       EvalState.QUEUED},
    # RUNNING → QUEUED is an automatic INFRA retry.
    EvalState.RUNNING: {EvalState.DONE, EvalState.INFRA, EvalState.CANCELLED, EvalState.SUPERSEDED, EvalState.QUEUED},
    EvalState.DONE: set(),
    EvalState.INFRA: set(),
    EvalState.CANCELLED: set(),
    EvalState.SUPERSEDED: set(),
}


class Trigger(str, Enum):
    AUTO = "auto"  # opened/pushed by a trusted author
    APPROVAL = "approval"  # maintainer applied the approval label
    COMMAND = "command"  # /eval or /eval rerun
    CHECK_RERUN = "check_rerun"  # "Re-run" on the check run
    ROUND = "round"  # merge-first re-evaluation against fresh main
    RETRY = "retry"  # automatic INFRA retry


class InfraReason(str, Enum):
    """Why the bot itself records an INFRA result (the summary wording is in templates/infra_summary.txt.j2)."""
    TASK_FAILED = "task_failed"  # the gpu task raised or its worker process died
    MALFORMED_RESULT = "malformed_result"
    WRONG_REVISIONS = "wrong_revisions"
    WORKER_LOST = "worker_lost"  # watchdog: no heartbeat from the running task
    MESSAGE_LOST = "message_lost"  # watchdog: a queued task is neither in the queue nor on a worker
    RUN_TIMEOUT = "run_timeout"  # watchdog: running past the deadline
    QUEUE_TIMEOUT = "queue_timeout"  # watchdog: waiting past the deadline


class Command(str, Enum):
    EVAL = "eval"
    RERUN = "rerun"
    CANCEL = "cancel"
    STATUS = "status"


class CheckStatus(str, Enum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class CheckConclusion(str, Enum):
    SUCCESS = "success"
    NEUTRAL = "neutral"
    FAILURE = "failure"
    ACTION_REQUIRED = "action_required"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


# Other apps' check conclusions that count as green for merge-first.
GREEN_CONCLUSIONS = frozenset({CheckConclusion.SUCCESS.value, CheckConclusion.NEUTRAL.value,
                               CheckConclusion.SKIPPED.value})
RERUN_ACTION_ID = "rerun"  # the check run's requested action (its wording is in templates/check_actions.j2)


class RoundAction(str, Enum):
    """What closing a round does to one candidate."""
    MERGE = "merge"
    SKIP = "skip"
    REEVALUATE = "reevaluate"
    NOTIFY = "notify"


class WatchdogAction(str, Enum):
    LOST = "lost"  # the attempt's task is gone or overdue: INFRA, retried per settings
    RECOVER = "recover"  # the task finished but its result was never published: publish it
    RESEND = "resend"  # the broker refused the attempt's task when it was dispatched: send it again


class RoundState(str, Enum):
    OPEN = "open"
    CLOSED = "closed"


LABEL_PREFIX = "eval:"
MERGE_FIRST_LABEL = "merge-first"


def verdict_label(verdict: Verdict) -> str:
    # BUILD_FAILED is the PR's fault: it shows as REJECT on the label, the comment says why.
    shown = Verdict.REJECT if verdict is Verdict.BUILD_FAILED else verdict
    return f"{LABEL_PREFIX}{shown.value}"


def model_label(model: str, tier: str) -> str:
    return f"eval-{model}:{tier}"


def regression_label(model: str, gate: str) -> str:
    return f"regression-{model}-{gate}"


def is_managed_label(name: str) -> bool:
    """Labels this service owns (replaced on every verdict); everything else is left alone."""
    return name.startswith(LABEL_PREFIX) or name.startswith("eval-") and ":" in name or name.startswith("regression-")


def check_conclusion(verdict: Verdict) -> CheckConclusion:
    if verdict is Verdict.INFRA:
        return CheckConclusion.ACTION_REQUIRED
    if verdict in (Verdict.REJECT, Verdict.BUILD_FAILED, Verdict.MIXED):
        return CheckConclusion.FAILURE
    if verdict in (Verdict.NONE, Verdict.UNCALIBRATED, Verdict.WITHHELD):  # no pass, never merged
        return CheckConclusion.NEUTRAL
    return CheckConclusion.SUCCESS
