"""What each dashboard page shows, read from the database (no HTML here: templates/web/ renders it)."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from bot.db.models import (ChangePoint, Evaluation, HistoryPoint, MainMeasurement, PullRequest, Receipt, Repository)
from bot.enums import EvalState
from bot.history.detect import FALSE_ALARM_RATE
from bot.history.job import MAIN_ORDER, NOT_OFF_MAIN, by_machine, gates_of, series
from bot.queue.position import queue_info
from bot.render import short
from bot.web.svg import Point, line_plot
from worker.records import TIER_ORDER, EvalResult, Verdict

WINS = {v.value for v in TIER_ORDER if v is not Verdict.NONE}
DRIFT_RATIO = 1.5  # a gate's noise floor this many times above (or below) the host's usual one is drift


def repo_by_name(session: Session, full_name: str) -> Repository | None:
    """GitHub's names are case-insensitive; nothing else in the path is a pattern (ILIKE took % and _ as ones)."""
    return session.scalar(select(Repository).where(func.lower(Repository.full_name) == full_name.lower()))


def eval_url(ev_id: int) -> str:
    return f"/evaluations/{ev_id}"


def measurement_url(m_id: int) -> str:
    return f"/measurements/{m_id}"


def latest_main(session: Session, repo: Repository) -> list[HistoryPoint]:
    out = []
    for model, gate in gates_of(session, repo.id):
        pts = series(session, repo.id, model, gate)
        if pts:
            out.append(pts[-1])
    return out


def repo_evaluations(session: Session, repo: Repository, states=None, limit: int = 20) -> list[Evaluation]:
    q = select(Evaluation).join(PullRequest).where(PullRequest.repository_id == repo.id)
    if states is not None:
        q = q.where(Evaluation.state.in_(states))
    return list(session.scalars(q.order_by(Evaluation.id.desc()).limit(limit)))


def overview(session: Session, repo: Repository) -> dict:
    return {"latest": latest_main(session, repo),
            "open": repo_evaluations(session, repo, [EvalState.QUEUED, EvalState.RUNNING]),
            "finished": repo_evaluations(session, repo, [EvalState.DONE, EvalState.INFRA], limit=10),
            "change_points": list(session.scalars(select(ChangePoint).where(ChangePoint.repository_id == repo.id)
                                                  .order_by(ChangePoint.id.desc()).limit(10)))}


@dataclass
class GateHistory:
    model: str
    gate: str
    points: list[HistoryPoint]
    change_points: list[ChangePoint]
    plot: Any = None
    machine: str = ""  # job.machine_of: absolute tok/s of one profile on one device model are one series
    unplaced: int = 0  # points the change-point scan has not placed on main's commit line yet: plotted last
    anchor: str = ""  # the section's id: model-gate, then -2, -3 for a gate's further machines


def history(session: Session, repo: Repository, model: str | None = None, gate: str | None = None) -> dict:
    gates = []
    for m, g in gates_of(session, repo.id):
        if (model and m != model) or (gate and g != gate):
            continue
        cps = list(session.scalars(select(ChangePoint).where(ChangePoint.repository_id == repo.id,
                                                            ChangePoint.model == m, ChangePoint.gate == g)))
        groups = by_machine(session, series(session, repo.id, m, g))
        placed = {p.sha for pts in groups.values() for p in pts}
        for i, (machine, pts) in enumerate(groups.items()):
            index = {p.sha: i for i, p in enumerate(pts)}
            # each change point beside the series it was found in (one whose commit is in none: the first)
            mine = [c for c in cps if c.sha in index or (i == 0 and c.sha not in placed)]
            gh = GateHistory(m, g, pts, mine, machine=machine, anchor=f"{m}-{g}" + (f"-{i + 1}" if i else ""),
                             unplaced=session.scalar(select(func.count()).where(
                                 MainMeasurement.id.in_({p.measurement_id for p in pts}),
                                 MainMeasurement.main_position.is_(None))))
            gh.plot = line_plot([Point(short(p.sha), p.tok_s, measurement_url(p.measurement_id),
                                       f"{short(p.sha)}: {p.tok_s:,.1f} tok/s") for p in pts],
                                y_label=f"{m} {g} tok/s", marks=[index[c.sha] for c in mine if c.sha in index])
            gates.append(gh)
    mems = list(session.scalars(select(MainMeasurement).where(
        MainMeasurement.repository_id == repo.id, MainMeasurement.kind == "merge", MainMeasurement.state == "done",
        MainMeasurement.peak_memory_bytes.is_not(None), NOT_OFF_MAIN).order_by(*MAIN_ORDER)))
    kinds = {m.memory_kind for m in mems}
    label = "peak GPU memory (MiB)" if kinds == {"gpu"} else "peak memory (MiB; RSS on CPU evaluations)"
    memory_plot = line_plot([Point(short(m.sha), m.peak_memory_bytes / 2**20, measurement_url(m.id),
                                   f"{short(m.sha)}: {m.peak_memory_bytes / 2**20:,.1f} MiB ({m.memory_kind})")
                             for m in mems], y_label=label, css_class="plot memory")
    return {"gates": gates, "memory_plot": memory_plot, "memory_points": len(mems), "false_alarm_rate": FALSE_ALARM_RATE}


@dataclass
class Win:
    evaluation: Evaluation
    pr: PullRequest
    gates: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, gate) → rel change
    cumulative: dict[tuple[str, str], float] = field(default_factory=dict)


def journey(session: Session, repo: Repository) -> dict:
    """Merged PRs whose final evaluation was a win, oldest first, with the cumulative speedup per gate
    (the product of each win's measured change: what the wins add up to if nothing else moved)."""
    merged = list(session.scalars(select(MainMeasurement).where(
        MainMeasurement.repository_id == repo.id, MainMeasurement.kind == "merge",
        MainMeasurement.pull_request_id.is_not(None)).order_by(MainMeasurement.id)))
    wins, running = [], defaultdict(lambda: 1.0)
    for m in merged:
        ev = session.scalar(select(Evaluation).where(Evaluation.pull_request_id == m.pull_request_id,
                                                     Evaluation.state == EvalState.DONE)
                            .order_by(Evaluation.id.desc()).limit(1))
        if ev is None or ev.verdict not in WINS:
            continue
        win = Win(ev, m.pull_request)
        for g in ev.gates:
            if g.rel_change is not None and g.significant:
                win.gates[(g.model, g.gate)] = g.rel_change
                running[(g.model, g.gate)] *= 1 + g.rel_change
        win.cumulative = {k: v - 1 for k, v in running.items()}
        wins.append(win)
    keys = sorted(running)
    plots = []
    for key in keys:
        pts = [Point(f"#{w.pr.number}", 100 * w.cumulative[key], eval_url(w.evaluation.id),
                     f"PR #{w.pr.number} by {w.pr.author_login}: {100 * w.cumulative[key]:+.1f}% cumulative")
               for w in wins if key in w.cumulative]
        plots.append((key, line_plot(pts, y_label=f"{key[0]} {key[1]} cumulative %", css_class="plot journey")))
    return {"wins": wins, "keys": keys, "plots": plots,
            "total": {k: v - 1 for k, v in running.items()}}


def phases(ev_or_m, result: EvalResult | None) -> list[tuple[str, float | None]]:
    """Per-phase seconds: waiting in the queue, the run, and inside it each model's loads and timed gates."""
    rows: list[tuple[str, float | None]] = []
    created, started = getattr(ev_or_m, "created_at", None), getattr(ev_or_m, "started_at", None)
    if created and started:
        rows.append(("queued", (started - created).total_seconds()))
    receipt = result.receipt if result else {}
    for role, proc in (receipt.get("processes") or {}).items():
        loads = (proc.get("hello") or {}).get("load_seconds")  # receipts before 939144f kept the revision's own
        for model, secs in (loads.items() if isinstance(loads, dict) else ()):
            number = isinstance(secs, (int, float)) and not isinstance(secs, bool) and math.isfinite(secs)
            rows.append((f"load {model} ({role})", secs if number else None))
    for model, mr in (receipt.get("models") or {}).items():
        for key, pairs in (mr.get("wall_seconds") or {}).items():
            rows.append((f"timed {model} {key}", sum(sum(p) for p in pairs)))
    rows.append(("whole evaluation", result.duration_s if result else getattr(ev_or_m, "duration_s", None)))
    return rows


def gpu_of(receipt: dict) -> str:
    gpu = (receipt.get("host") or {}).get("gpu") or {}
    if gpu.get("name"):
        return gpu["name"]
    if receipt.get("gpu"):
        return str(receipt["gpu"])
    return f"none ({gpu.get('reason') or 'not reported'})"


def provenance(receipt: dict) -> list[tuple[str, str]]:
    host = receipt.get("host") or {}
    rows = [("GPU", gpu_of(receipt)), ("host", receipt.get("host_key") or host.get("hostname") or "not reported"),
            ("harness", str(receipt.get("harness_version") or receipt.get("harness") or "not reported")),
            ("created", str(receipt.get("created") or "not reported"))]
    for role, rev in (receipt.get("revisions") or {}).items():
        rows.append((f"{role} revision", f"{rev.get('sha')} ({rev.get('ref')})"))
    for model, mr in (receipt.get("models") or {}).items():
        rows.append((f"{model} GGUF sha256", f"{mr.get('gguf_sha256')} ({mr.get('role')})"))
    for k, v in ((host.get("versions") or {}).items()):
        rows.append((f"version {k}", str(v)))
    iso = receipt.get("isolation")
    if iso:
        rows.append(("isolation", ", ".join(f"{k}={v}" for k, v in iso.items()) if isinstance(iso, dict) else str(iso)))
    return rows


def queue(session: Session, gpu_workers: int) -> dict:
    evs = list(session.scalars(select(Evaluation).where(Evaluation.state.in_([EvalState.RUNNING, EvalState.QUEUED]))
                               .order_by(Evaluation.state.desc(), Evaluation.id)))
    rows = [(ev, queue_info(session, ev, gpu_workers)) for ev in evs]
    main = list(session.scalars(select(MainMeasurement).where(MainMeasurement.state.in_(["queued", "running", "unsent"]))
                                .order_by(MainMeasurement.id)))
    return {"running": [r for r in rows if r[0].state is EvalState.RUNNING],
            "waiting": [r for r in rows if r[0].state is EvalState.QUEUED], "main": main}


@dataclass
class HostGate:
    model: str
    gate: str
    floor: float | None
    calibrated: bool
    aa_deltas: int | None
    bound: float | None
    usual_floor: float | None
    drift: bool


@dataclass
class Host:
    key: str
    gpu: str
    evaluations: int
    last_seen: str
    last_eval_id: int | None
    gates: list[HostGate]

    @property
    def calibrated(self) -> bool:
        return bool(self.gates) and all(g.calibrated for g in self.gates)

    @property
    def alarms(self) -> list[HostGate]:
        return [g for g in self.gates if g.drift]


def hosts(session: Session) -> list[Host]:
    """Each measuring host (the receipts' host_key): calibration of every gate's noise floor from its most
    recent receipt, and drift when that floor left DRIFT_RATIO of the median of the host's earlier ones."""
    rows = session.execute(select(Receipt.data, Receipt.evaluation_id, Receipt.created_at)
                           .order_by(Receipt.created_at)).all()
    by_host: dict[str, list] = defaultdict(list)
    for data, ev_id, created in rows:
        by_host[data.get("host_key") or (data.get("host") or {}).get("hostname") or "unknown"].append(
            (data, ev_id, created))
    out = []
    for key, recs in sorted(by_host.items()):
        floors: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for data, _, _ in recs:
            for model, mr in (data.get("models") or {}).items():
                for gate, nf in (mr.get("noise_floors") or {}).items():
                    floors[(model, gate)].append(nf)
        gates = []
        for (model, gate), seq in sorted(floors.items()):
            last = seq[-1]
            earlier = [x["floor"] for x in seq[:-1] if x.get("floor")]
            usual = statistics.median(earlier) if earlier else None
            drift = bool(usual and last.get("floor") and not (1 / DRIFT_RATIO <= last["floor"] / usual <= DRIFT_RATIO))
            gates.append(HostGate(model, gate, last.get("floor"), bool(last.get("calibrated")), last.get("aa_deltas"),
                                  last.get("bound"), usual, drift))
        data, ev_id, created = recs[-1]
        out.append(Host(key, gpu_of(data), len(recs), created.strftime("%Y-%m-%d %H:%M UTC"), ev_id, gates))
    return out
