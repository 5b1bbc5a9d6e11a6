"""SQLAlchemy 2 models: what the service remembers between webhooks."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text,
                        UniqueConstraint, false as sa_false, text)
from sqlalchemy import Enum as SAEnum
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from bot.enums import EvalState, RoundState, Trigger


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def aware(t: datetime | None) -> datetime | None:
    """A stored time as UTC-aware (SQLite reads timestamps back naive; PostgreSQL's are timestamptz)."""
    return t.replace(tzinfo=timezone.utc) if t is not None and t.tzinfo is None else t


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), dict[str, Any]: JSON}


def _enum(cls):
    # Stored as the value strings ("queued"), checked by a constraint-free VARCHAR so adding a state needs no ALTER TYPE.
    return SAEnum(cls, native_enum=False, length=32, values_callable=lambda e: [m.value for m in e],
                  validate_strings=True)


class Installation(Base):
    __tablename__ = "installations"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)  # GitHub's id
    account_login: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None]


class Repository(Base):
    __tablename__ = "repositories"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)  # GitHub's id
    installation_id: Mapped[int | None] = mapped_column(ForeignKey("installations.id", ondelete="SET NULL"))
    # GitHub's id is the identity; a name taken over by another id (rename, re-creation) is freed first.
    full_name: Mapped[str] = mapped_column(String(255), unique=True)
    clone_url: Mapped[str | None] = mapped_column(Text)
    default_branch: Mapped[str] = mapped_column(String(255), default="main")


class PullRequest(Base):
    __tablename__ = "pull_requests"
    __table_args__ = (UniqueConstraint("repository_id", "number"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"))
    number: Mapped[int]
    title: Mapped[str] = mapped_column(Text, default="")
    html_url: Mapped[str | None] = mapped_column(Text)
    author_login: Mapped[str] = mapped_column(String(255))
    head_sha: Mapped[str] = mapped_column(String(64))
    head_ref: Mapped[str] = mapped_column(String(255))
    head_clone_url: Mapped[str | None] = mapped_column(Text)
    base_ref: Mapped[str] = mapped_column(String(255))
    base_sha: Mapped[str] = mapped_column(String(64))
    is_open: Mapped[bool] = mapped_column(Boolean, default=True)
    approved_sha: Mapped[str | None] = mapped_column(String(64))  # head the approval label applies to
    sticky_comment_id: Mapped[int | None] = mapped_column(BigInteger)
    awaiting_approval: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    # GitHub's pull_request.updated_at of the payload the stored head came from: older payloads never win.
    head_updated_at: Mapped[datetime | None]
    # [[sha, first seen (ISO)], ...], newest last: which head a maintainer could have seen when commenting.
    head_history: Mapped[list | None] = mapped_column(JSON)

    repository: Mapped[Repository] = relationship()
    evaluations: Mapped[list["Evaluation"]] = relationship(back_populates="pull_request",
                                                           order_by="Evaluation.id.desc()")


class Delivery(Base):
    """One row per X-GitHub-Delivery, and the outbox: the signed body is stored (committed) before GitHub gets
    its answer; the publish side handles it by id and marks it processed in the transaction of its effect."""
    __tablename__ = "deliveries"
    # The drain's question ("what is waiting?") stays an index scan however many processed rows pile up.
    __table_args__ = (Index("ix_deliveries_waiting", "received_at",
                            postgresql_where=text("processed_at IS NULL AND failed_at IS NULL"),
                            sqlite_where=text("processed_at IS NULL AND failed_at IS NULL")),)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    event: Mapped[str] = mapped_column(String(64))
    action: Mapped[str | None] = mapped_column(String(64))  # filled in when the handle task reads the body
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    processed_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(Text)  # what the handler did, for operators
    # The raw signed body as GitHub sent it: the web request stores it unparsed (bot/queue/intake.py).
    body: Mapped[bytes | None] = mapped_column(LargeBinary)
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # rows stored before `body` existed
    # sha256 of the signed body: a captured body replayed under a new delivery id is a duplicate.
    body_sha256: Mapped[str | None] = mapped_column(String(64), unique=True)
    enqueued_at: Mapped[datetime | None]  # last time a handle task was sent for it
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None]  # after a failure: not before this
    last_error: Mapped[str | None] = mapped_column(Text)
    failed_at: Mapped[datetime | None]  # given up (retries exhausted); `tokengate deliveries requeue` revives it


class Evaluation(Base):
    __tablename__ = "evaluations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pull_request_id: Mapped[int] = mapped_column(ForeignKey("pull_requests.id", ondelete="CASCADE"), index=True)
    head_sha: Mapped[str] = mapped_column(String(64))
    base_sha: Mapped[str] = mapped_column(String(64))
    base_ref: Mapped[str] = mapped_column(String(255))
    state: Mapped[EvalState] = mapped_column(_enum(EvalState), default=EvalState.QUEUED, index=True)
    trigger: Mapped[Trigger] = mapped_column(_enum(Trigger))
    requested_by: Mapped[str | None] = mapped_column(String(255))
    # The delivery whose handling asked for it: a handler that dies after its dispatch committed is handled again
    # when its claim lapses, and finds its evaluation here instead of asking for another (`/eval rerun` twice).
    delivery_id: Mapped[str | None] = mapped_column(String(64), index=True)
    profile: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    celery_task_id: Mapped[str | None] = mapped_column(String(64))
    check_run_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    dispatched_at: Mapped[datetime | None]  # the current attempt's task was sent (the watchdog's clock)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    duration_s: Mapped[float | None] = mapped_column(Float)
    worker_host: Mapped[str | None] = mapped_column(String(255))
    # The GPU worker this attempt is bound to: the first whose signed claim (or result) arrived; a result
    # signed by any other worker's key is refused. Cleared when a new attempt is dispatched.
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    verdict: Mapped[str | None] = mapped_column(String(32))
    summary: Mapped[str | None] = mapped_column(Text)
    best_speedup: Mapped[float | None] = mapped_column(Float)
    infra_kind: Mapped[str | None] = mapped_column(String(64))
    infra_detail: Mapped[str | None] = mapped_column(Text)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # EvalResult.to_dict() as received
    result_worker: Mapped[str | None] = mapped_column(String(64))  # the GPU worker whose key signed the result

    pull_request: Mapped[PullRequest] = relationship(back_populates="evaluations")
    gates: Mapped[list["GateResultRow"]] = relationship(cascade="all, delete-orphan")
    guards: Mapped[list["GuardResultRow"]] = relationship(cascade="all, delete-orphan")
    receipt: Mapped["Receipt | None"] = relationship(cascade="all, delete-orphan")

    @property
    def unsent(self) -> bool:
        """Queued, but the broker refused its task (Service._dispatch): send it again, never call it lost."""
        return self.state is EvalState.QUEUED and self.dispatched_at is None


class GateResultRow(Base):
    __tablename__ = "gate_results"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"), index=True)
    model: Mapped[str] = mapped_column(String(128))
    gate: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    base_median: Mapped[float | None] = mapped_column(Float)
    head_median: Mapped[float | None] = mapped_column(Float)
    rel_change: Mapped[float | None] = mapped_column(Float)
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    noise_floor: Mapped[float | None] = mapped_column(Float)
    floor_slower: Mapped[float | None] = mapped_column(Float)  # the one-sided floors (worker/records.py)
    floor_faster: Mapped[float | None] = mapped_column(Float)
    floor_widening: Mapped[float] = mapped_column(Float, default=1.0, server_default="1.0")  # > 1: host noisier
    significant: Mapped[bool] = mapped_column(Boolean)
    regression: Mapped[bool] = mapped_column(Boolean)
    scored: Mapped[bool] = mapped_column(Boolean, default=False)
    n_pairs: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str | None] = mapped_column(Text)
    # slower in every pair timed but left unconfirmed: another gate of its model confirmed (worker/gates/confirm.py)
    not_confirmed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())


class GuardResultRow(Base):
    __tablename__ = "guard_results"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"), index=True)
    model: Mapped[str] = mapped_column(String(128))
    seeds: Mapped[list[int]] = mapped_column(JSON)
    head_top1: Mapped[float | None] = mapped_column(Float)
    base_top1: Mapped[float | None] = mapped_column(Float)
    head_kl: Mapped[float | None] = mapped_column(Float)
    base_kl: Mapped[float | None] = mapped_column(Float)
    top1_floor: Mapped[float | None] = mapped_column(Float)
    paired_delta: Mapped[float | None] = mapped_column(Float)
    max_drop: Mapped[float | None] = mapped_column(Float)
    kl_bound: Mapped[float | None] = mapped_column(Float)
    bit_identical: Mapped[bool] = mapped_column(Boolean)
    passed: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(Text)


class Receipt(Base):
    """Provenance and resources of one evaluation, as the worker reported them."""
    __tablename__ = "receipts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"), unique=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Round(Base):
    __tablename__ = "rounds"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    state: Mapped[RoundState] = mapped_column(_enum(RoundState), default=RoundState.OPEN)
    opened_at: Mapped[datetime] = mapped_column(default=utcnow)
    closes_at: Mapped[datetime]
    closed_at: Mapped[datetime | None]
    winner_pull_request_id: Mapped[int | None] = mapped_column(ForeignKey("pull_requests.id", ondelete="SET NULL"))
    winner_speedup: Mapped[float | None] = mapped_column(Float)
    outcome: Mapped[str | None] = mapped_column(Text)


# ---- main's history, change points and bisection (the dashboard, issue 16) -------------------------

class MainMeasurement(Base):
    """One evaluation of a commit on the default branch: after a merge (`merge`, measured against its
    first parent) or while bisecting a change point (`bisect`, measured against the last good commit).
    Not an `Evaluation`: no pull request owns it, no check run or sticky comment follows it."""
    __tablename__ = "main_measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # "merge" | "bisect"
    sha: Mapped[str] = mapped_column(String(64))
    base_sha: Mapped[str] = mapped_column(String(64))  # what it was measured against
    pull_request_id: Mapped[int | None] = mapped_column(ForeignKey("pull_requests.id", ondelete="SET NULL"))
    change_point_id: Mapped[int | None] = mapped_column(ForeignKey("change_points.id", ondelete="CASCADE"))
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)  # queued|running|done|failed
    profile: Mapped[str] = mapped_column(String(32))
    celery_task_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    merged_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    duration_s: Mapped[float | None] = mapped_column(Float)
    worker_host: Mapped[str | None] = mapped_column(String(255))
    verdict: Mapped[str | None] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(Text)  # why it failed, for operators
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_kind: Mapped[str | None] = mapped_column(String(16))  # "gpu" (NVML) | "rss" (CPU evaluations)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # EvalResult.to_dict() as received
    # where the commit stands on the default branch's first-parent line, oldest 0, as the last change-point scan
    # read it (None: not read since it landed; job.OFF_MAIN: no longer on main): main's history in that order
    main_position: Mapped[int | None] = mapped_column(Integer)

    repository: Mapped[Repository] = relationship()
    pull_request: Mapped[PullRequest | None] = relationship()
    points: Mapped[list["HistoryPoint"]] = relationship(cascade="all, delete-orphan")


class HistoryPoint(Base):
    """One gate of one main measurement: what the history plots and the change-point job read."""
    __tablename__ = "history_points"
    __table_args__ = (UniqueConstraint("measurement_id", "model", "gate"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    measurement_id: Mapped[int] = mapped_column(ForeignKey("main_measurements.id", ondelete="CASCADE"), index=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    sha: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    gate: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    tok_s: Mapped[float | None] = mapped_column(Float)  # the commit's median (None: not measured, see reason)
    base_tok_s: Mapped[float | None] = mapped_column(Float)
    rel_change: Mapped[float | None] = mapped_column(Float)  # vs what it was measured against
    significant: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text)


class ChangePoint(Base):
    """A level shift found in main's history of one gate; posted once, then bisected to one commit."""
    __tablename__ = "change_points"
    __table_args__ = (UniqueConstraint("repository_id", "model", "gate", "sha"),)  # the "posts once" key
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    model: Mapped[str] = mapped_column(String(128))
    gate: Mapped[str] = mapped_column(String(64))
    sha: Mapped[str] = mapped_column(String(64))  # first measured commit at the new level
    previous_sha: Mapped[str] = mapped_column(String(64))  # last measured commit at the old level
    rel_step: Mapped[float] = mapped_column(Float)  # new level / old level - 1
    false_alarm_rate: Mapped[float] = mapped_column(Float)  # the detector's stated rate per history
    detected_at: Mapped[datetime] = mapped_column(default=utcnow)
    state: Mapped[str] = mapped_column(String(16), default="bisecting")  # bisecting|named|unresolved
    good_sha: Mapped[str] = mapped_column(String(64))  # the bisection's bracket: good < culprit <= bad
    bad_sha: Mapped[str] = mapped_column(String(64))
    culprit_sha: Mapped[str | None] = mapped_column(String(64))
    pull_request_number: Mapped[int | None] = mapped_column(Integer)  # where it was posted (the merged PR)
    issue_number: Mapped[int | None] = mapped_column(Integer)
    comment_id: Mapped[int | None] = mapped_column(BigInteger)
    detail: Mapped[str | None] = mapped_column(Text)
    # the post's last edit was refused (GitHub down): it shows an older state until a beat edits it again
    post_stale: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())

    repository: Mapped[Repository] = relationship()


class RepositoryVisibility(Base):
    """Whether a repository is private, as GitHub said when the dashboard first needed to know."""
    __tablename__ = "repository_visibility"
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), primary_key=True)
    private: Mapped[bool] = mapped_column(Boolean)
    checked_at: Mapped[datetime] = mapped_column(default=utcnow)
