"""GPU idle check: the frozen revision must run no kernels while the other one is timed.

cgroup.freeze stops the idle revision's threads, not the GPU: kernels it queued before it was
frozen (from a thread the driver never synchronised, after it answered) still run and share the
SMs with the timed revision. Its driver's word that it synchronised is worth nothing (it runs in
the revision's interpreter), so the parent reads NVML's per-process utilisation samples
(nvmlDeviceGetProcessUtilization) for the idle revision's host PIDs (its cgroup's processes and
their tree) over the timed window. A window in which the idle one shows SM activity is void and
timed again (worker/gates/bench.py); a revision that keeps doing it is named as the cause.

NVML keeps one sample per process: its latest sampling period with non-zero use, stamped at the
period's end. A sample stamped within one period of the window's start can still be the idle
revision's own previous (legitimate, synchronised) request, so samples count only from
max(`settle_s`, 1.5 x the sampling period NVML shows on this GPU) into the window; windows shorter
than that are counted as not covered. Where NVML gives no per-process samples, or speaks another
PID namespace, the check says it was not applied and why; it never says it passed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from worker import sandbox


@dataclass
class IdleReading:
    applicable: bool
    busy: bool = False
    covered: bool = False  # the window was longer than settle_s, so activity in it could be seen
    sm_util: int = 0  # the highest SM % the idle revision showed in the window
    reason: str | None = None


def revision_pids(proc) -> set[int]:
    """Host PIDs of a revision: its cgroup's processes (setsid'd or double-forked ones too) and its tree."""
    pids: set[int] = set()
    if getattr(proc, "cgroup", None) is not None:
        try:
            pids.update(proc.cgroup.pids())
        except OSError:
            pass
    if getattr(proc, "proc", None) is not None:
        pids.update(sandbox.tree_pids(proc.proc.pid))
    return pids


@dataclass
class IdleGpuCheck:
    """`check(timed, idle, t0, t1)` after each timed request (t0/t1: epoch seconds of the window)."""

    nv: object  # worker.telemetry.Nvml (or a stand-in with `ok`, `reason`, `process_utilization`)
    settle_s: float
    pids_of: Callable[[object], set[int]] = revision_pids
    windows: int = 0
    covered: int = 0
    busy: list[dict] = field(default_factory=list)
    reason: str | None = None  # set once the check turned out not to apply
    period_s: float | None = None  # NVML's sampling period here (read once)
    _settle: float | None = None

    def settle(self) -> float:
        if self._settle is None:
            read = getattr(self.nv, "utilization_period_s", None)
            self.period_s = read() if read is not None else None
            self._settle = max(self.settle_s, 1.5 * self.period_s if self.period_s else 0.0)
        return self._settle

    def check(self, timed, idle, t0: float, t1: float) -> IdleReading:
        self.windows += 1
        if not getattr(self.nv, "ok", False):
            return self._na(getattr(self.nv, "reason", None) or "NVML unavailable")
        settle = self.settle()
        samples = self.nv.process_utilization(t0)
        if samples is None:
            return self._na("NVML gives no per-process utilisation samples on this GPU/driver")
        idle_pids, timed_pids = self.pids_of(idle), self.pids_of(timed)
        sampled = {pid for pid, sm, _ in samples if sm > 0}
        if sampled and not sampled & (idle_pids | timed_pids):
            # The timed revision worked in this window yet NVML names none of our PIDs: it reports
            # another PID namespace (a container), so nothing can be attributed.
            return self._na("NVML's process IDs are in another PID namespace; samples cannot be attributed")
        covered = t1 - t0 > settle
        self.covered += covered
        late = [sm for pid, sm, ts in samples if pid in idle_pids and sm > 0 and ts > t0 + settle]
        if late:
            self.busy.append({"idle": idle.role, "timed": timed.role, "sm_util": max(late),
                              "window_s": round(t1 - t0, 4)})
            return IdleReading(True, True, covered, max(late))
        return IdleReading(True, False, covered)

    def _na(self, reason: str) -> IdleReading:
        self.reason = self.reason or reason
        return IdleReading(False, reason=reason)

    def receipt(self) -> dict:
        return {"applicable": self.reason is None, "reason": self.reason, "settle_s": self._settle,
                "nvml_period_s": self.period_s,
                "windows": self.windows, "covered": self.covered, "busy": list(self.busy)}


def not_applicable(reason: str) -> dict:
    """The receipt's entry where the check cannot run (CPU evaluation): said, never passed."""
    return {"applicable": False, "reason": reason}
