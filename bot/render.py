"""Turn evaluations into the words GitHub shows (all wording is in templates/)."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from bot.enums import EvalState, InfraReason, check_conclusion, verdict_label
from worker import safe_text
from worker.records import EvalResult, Verdict

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
STICKY_MARKER = "<!-- tokengate:sticky -->"

VERDICT_ICON = {
    Verdict.XL: "🚀", Verdict.L: "✅", Verdict.M: "✅", Verdict.S: "✅", Verdict.NONE: "➖",
    Verdict.REJECT: "❌", Verdict.BUILD_FAILED: "❌", Verdict.INFRA: "⚠️",
    Verdict.MIXED: "⚖️", Verdict.UNCALIBRATED: "❔", Verdict.WITHHELD: "⏸️",
}


def pct(x: float | None, reason: str | None = None) -> str:
    """A relative change as a signed percentage; a missing value says so instead of pretending."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return f"n/a ({reason})" if reason else "n/a"
    return f"{x * 100:+.1f}%"


def percent(x: float | None) -> str:
    """An absolute share (top-1 agreement, a floor): no sign."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x * 100:.1f}%"


def num(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.{digits}f}"
    return f"{x:.{max(digits, 3 if abs(x) < 1 else digits)}f}"


def short(sha: str | None) -> str:
    return (sha or "")[:7]


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def device_name(run) -> str:
    """The GPU (or CPU) the run's result was measured on, from its receipt; "the worker" before one exists."""
    host = ((run.result.receipt if run.result else None) or {}).get("host") or {}
    gpu = (host.get("gpu") or {}).get("name")
    gpu = gpu.get("value") if isinstance(gpu, dict) else gpu
    return gpu or (f"CPU ({host['cpu_model']})" if host.get("cpu_model") else "the worker")


@functools.lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES_DIR), undefined=StrictUndefined, trim_blocks=True,
                      lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters.update(pct=pct, percent=percent, num=num, short=short, duration=duration, device_name=device_name,
                       **safe_text.FILTERS)
    env.globals.update(Verdict=Verdict, EvalState=EvalState, InfraReason=InfraReason, icon=VERDICT_ICON,
                       verdict_label=verdict_label, marker=STICKY_MARKER)
    return env


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)


@dataclass
class QueueInfo:
    position: int | None  # 1 = next to start; None when not queued
    ahead_running: int
    eta_s: float | None  # None: no recent durations to estimate from
    median_duration_s: float | None


@dataclass
class RunView:
    """One evaluation as the templates see it."""
    id: int
    state: EvalState
    head_sha: str
    base_sha: str
    base_ref: str
    attempt: int
    max_attempts: int
    profile: str
    trigger: str
    requested_by: str | None
    created_at: datetime
    duration_s: float | None
    result: EvalResult | None
    queue: QueueInfo | None = None
    superseded_by: str | None = None
    retrying: bool = False  # an INFRA attempt that will be retried automatically
    page_url: str | None = None  # this evaluation's dashboard page (TOKENGATE_PUBLIC_BASE_URL set)

    @property
    def verdict(self) -> Verdict | None:
        return self.result.verdict if self.result else None

    @property
    def gpu(self) -> str | None:
        """The device the receipt names (None when there is no receipt yet)."""
        if self.result is None or not self.result.receipt:
            return None
        r = self.result.receipt
        gpu = (r.get("host") or {}).get("gpu") or {}
        return gpu.get("name") or r.get("gpu") or f"no GPU ({gpu.get('reason') or 'not reported'})"

    @property
    def models(self) -> list[ModelLine]:
        """Each measured model: primary or guard (the receipt's role), and its own tier."""
        if self.result is None or self.result.verdict in (Verdict.INFRA, Verdict.BUILD_FAILED):
            return []
        from bot.github.labels import model_verdicts
        from bot.settings import get_settings
        roles = {m: (v or {}).get("role") for m, v in (self.result.receipt.get("models") or {}).items()}
        out = []
        for model, tier in model_verdicts(self.result, get_settings().eval).items():
            scored = any(g.scored for g in self.result.gates if g.model == model)
            out.append(ModelLine(model, roles.get(model) or ("primary" if scored else "guard"), tier))
        return out


@dataclass
class ModelLine:
    name: str
    role: str  # "primary" (its gates set the tier) | "guard" (must not regress; never scored)
    tier: Verdict


def page_url(eval_id: int) -> str | None:
    from bot.settings import get_settings
    base = get_settings().public_base_url
    return f"{base.rstrip('/')}/evaluations/{eval_id}" if base else None


def run_view(ev, max_attempts: int, queue: QueueInfo | None = None) -> RunView:
    result = EvalResult.from_dict(ev.result) if ev.result else None
    # An active evaluation that already holds an INFRA result is waiting for its automatic retry.
    retrying = ev.state.active and result is not None and result.verdict is Verdict.INFRA
    return RunView(id=ev.id, state=ev.state, head_sha=ev.head_sha, base_sha=ev.base_sha, base_ref=ev.base_ref,
                   attempt=ev.attempt, max_attempts=max_attempts, profile=ev.profile, trigger=ev.trigger.value,
                   requested_by=ev.requested_by, created_at=ev.created_at, duration_s=ev.duration_s, result=result,
                   queue=queue, retrying=retrying, page_url=page_url(ev.id))


COMMENT_LIMIT = 65536  # GitHub refuses a longer comment body (422), and the sticky comment would keep its old text


def comment_length(body: str) -> int:
    """A body's length as GitHub may count it (UTF-16 code units: never fewer than the characters)."""
    return len(body.encode("utf-16-le")) // 2


def sticky_comment(*, current: RunView | None, earlier: list[RunView], awaiting_approval: bool,
                   approval_label: str, head_sha: str, models: list[str]) -> str:
    """The comment; earlier runs are left out, oldest first, while it is longer than GitHub takes (PR text
    lengthens when escaped: ten runs of a PR's error text and log tails went past the limit)."""
    shown = list(earlier)
    while True:
        body = render("sticky_comment.md.j2", current=current, earlier=shown, omitted=len(earlier) - len(shown),
                      awaiting_approval=awaiting_approval, approval_label=approval_label, head_sha=head_sha,
                      models=models)
        if comment_length(body) <= COMMENT_LIMIT or not shown:
            return body
        shown.pop()


def infra_summary(reason: InfraReason, **context) -> str:
    return render("infra_summary.txt.j2", reason=reason, **context).strip()


def check_output(run: RunView) -> dict[str, str]:
    """The check run's `output` (title + summary markdown)."""
    title = render("check_title.txt.j2", run=run).strip()
    summary = render("check_summary.md.j2", run=run)
    return {"title": title[:255], "summary": summary[:65000]}


def unrecorded_check_output() -> dict[str, str]:
    """The output of a check run whose evaluation the bot could not store (templates/check_unrecorded.j2)."""
    words = environment().get_template("check_unrecorded.j2").module
    return {"title": str(words.title()).strip(), "summary": str(words.summary()).strip()}


def conclusion_for(run: RunView) -> str:
    assert run.result is not None
    return check_conclusion(run.result.verdict).value
