"""One cgroup per revision process tree: memory and pid limits, CPU time, freeze, kill.

cgroup v2 gives every cgroup `cpu.stat` (usage of every thread that ever ran in it, exited ones
and children included), `cgroup.freeze` and `cgroup.kill` without any controller. Memory and pid
limits come from the v2 controllers when this cgroup may delegate them, otherwise from the v1
hierarchies of a hybrid host (memory.limit_in_bytes also charges tmpfs pages). Which backend
was used is part of the receipt (`limits()`).
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

V2_MOUNTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
V1_ROOT = Path("/sys/fs/cgroup")


class CgroupError(RuntimeError):
    pass


def _own_path(hierarchy: str) -> str | None:
    """This process's cgroup path in a hierarchy ('' = v2, else a v1 controller name)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if (hierarchy == "" and ctrls == "") or hierarchy in ctrls.split(","):
            return path
    return None


def _v2_mount() -> Path | None:
    for m in V2_MOUNTS:
        if (m / "cgroup.controllers").exists() and (m / "cgroup.procs").exists():
            return m
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _leave_root_of_subtree(base: Path, notes: list[str]) -> None:
    """cgroup v2's no-internal-processes rule: controllers can be enabled for children only when `base`
    itself holds no process (else EBUSY, as on a container's own cgroup). Move the processes of `base`
    (this worker's own) into a leaf `base/worker` first."""
    procs = [p for p in (base / "cgroup.procs").read_text().split() if p]
    if not procs:
        return
    leaf = base / "worker"
    try:
        leaf.mkdir(exist_ok=True)
        for pid in procs:
            try:
                _write(leaf / "cgroup.procs", pid)
            except ProcessLookupError:
                pass  # exited meanwhile
        notes.append(f"moved {len(procs)} process(es) of {base} into {leaf} to delegate controllers")
    except OSError as exc:
        notes.append(f"could not empty {base} for delegation: {exc}")


def _delegate_down_to(mount: Path, base: Path, ctrls: set[str], notes: list[str]) -> None:
    """Enable `ctrls` in every ancestor's subtree_control from the top down to `base`'s parent, where
    this process may (root on a VM whose manager delegated only some controllers, e.g. memory but
    not pids). A container's cgroup namespace hides its ancestors, so there this does nothing."""
    chain, d = [], base.parent
    while d != mount.parent and mount in (d, *d.parents):
        chain.append(d)
        d = d.parent
    for anc in reversed(chain):  # top down: a child can enable only what its parent enabled
        try:
            have = set((anc / "cgroup.subtree_control").read_text().split())
            avail = set((anc / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        for c in sorted((ctrls & avail) - have):
            try:
                _write(anc / "cgroup.subtree_control", f"+{c}")
                notes.append(f"enabled {c} for the children of {anc}")
            except OSError as exc:
                notes.append(f"could not enable {c} at {anc}: {exc}")


@dataclass
class Layout:
    """Where this worker may make child cgroups, and which backend enforces each limit."""
    v2: Path  # our parent directory in the v2 tree
    memory: tuple[str, Path] | None  # ("v2"|"v1", parent dir)
    pids: tuple[str, Path] | None
    notes: list[str] = field(default_factory=list)


def discover() -> Layout:
    """Find (and, in v2, create) a parent under this process's own cgroup; raises CgroupError."""
    mount = _v2_mount()
    own = _own_path("")
    if mount is None or own is None:
        raise CgroupError("no cgroup v2 hierarchy mounted (need /sys/fs/cgroup or /sys/fs/cgroup/unified)")
    base = mount / own.lstrip("/")
    parent = base / "tokengate"
    try:
        parent.mkdir(exist_ok=True)
    except OSError as exc:
        raise CgroupError(f"cannot create a child cgroup under {base}: {exc}") from exc
    for f in ("cgroup.freeze", "cgroup.kill", "cpu.stat"):
        if not (parent / f).exists():
            raise CgroupError(f"cgroup v2 at {parent} lacks {f} (kernel too old?)")
    notes = []
    avail = set((base / "cgroup.controllers").read_text().split())
    if {"memory", "pids"} - avail:
        _delegate_down_to(mount, base, {"memory", "pids"}, notes)
        avail = set((base / "cgroup.controllers").read_text().split())
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    want = {"memory", "pids"} & avail
    if want - enabled:
        _leave_root_of_subtree(base, notes)
    for c in want - enabled:
        try:
            _write(base / "cgroup.subtree_control", f"+{c}")
        except OSError as exc:
            notes.append(f"v2 {c} not delegable at {base}: {exc}")
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    for c in want & enabled:
        try:
            _write(parent / "cgroup.subtree_control", f"+{c}")
        except OSError as exc:
            notes.append(f"v2 {c} not delegable at {parent}: {exc}")
    sub = set((parent / "cgroup.subtree_control").read_text().split())

    def pick(ctrl: str):
        if ctrl in sub:
            return ("v2", parent)
        p1 = _own_path(ctrl)
        d = V1_ROOT / ctrl
        if p1 is not None and d.is_dir() and (d / "cgroup.procs").exists():
            d1 = d / p1.lstrip("/") / "tokengate"
            try:
                d1.mkdir(exist_ok=True)
                return ("v1", d1)
            except OSError as exc:
                notes.append(f"v1 {ctrl} at {d1}: {exc}")
        return None

    return Layout(parent, pick("memory"), pick("pids"), notes)


class RevisionCgroup:
    """The cgroup(s) one revision's process tree lives in; made before it starts, killed at the end."""

    def __init__(self, layout: Layout, name: str, *, memory_max: int | None, pids_max: int | None):
        self.name = f"{name}-{uuid.uuid4().hex[:8]}"
        self.layout = layout
        self.v2 = layout.v2 / self.name
        self.dirs = [self.v2]
        self.memory_max, self.pids_max = memory_max, pids_max
        self.mem_dir = self.pids_dir = None
        self.v2.mkdir()
        try:
            if memory_max is not None:
                self.mem_dir = self._dir(layout.memory, "memory")
                if layout.memory[0] == "v2":
                    _write(self.mem_dir / "memory.max", str(memory_max))
                    _write(self.mem_dir / "memory.swap.max", "0") if (self.mem_dir / "memory.swap.max").exists() else None
                else:
                    _write(self.mem_dir / "memory.limit_in_bytes", str(memory_max))
                    sw = self.mem_dir / "memory.memsw.limit_in_bytes"
                    if sw.exists():
                        _write(sw, str(memory_max))
            if pids_max is not None:
                self.pids_dir = self._dir(layout.pids, "pids")
                _write(self.pids_dir / "pids.max", str(pids_max))
        except BaseException:
            self.remove()
            raise

    def _dir(self, where, what: str) -> Path:
        if where is None:
            raise CgroupError(f"no {what} controller available (v2 or v1)")
        kind, parent = where
        if kind == "v2":
            return self.v2
        d = parent / self.name
        d.mkdir()
        self.dirs.append(d)
        return d

    # -- placing processes -------------------------------------------------------------------
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def attach_self(self) -> None:
        """Called in the child between fork and exec (preexec): everything it runs starts inside."""
        pid = str(os.getpid())
        for f in self.procs_files():
            with open(f, "w") as fh:
                fh.write(pid)

    # -- reading -----------------------------------------------------------------------------
    def cpu_usage_ns(self) -> int | None:
        """CPU time of every thread that ever ran in the cgroup (v2 cpu.stat usage_usec)."""
        try:
            for line in (self.v2 / "cpu.stat").read_text().splitlines():
                k, v = line.split()
                if k == "usage_usec":
                    return int(v) * 1000
        except (OSError, ValueError):
            return None
        return None

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.v2 / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def memory_peak(self) -> int | None:
        if self.mem_dir is None:
            return None
        for f in ("memory.peak", "memory.max_usage_in_bytes"):
            try:
                return int((self.mem_dir / f).read_text())
            except (OSError, ValueError):
                continue
        return None

    def memory_current(self) -> int | None:
        if self.mem_dir is None:
            return None
        for f in ("memory.current", "memory.usage_in_bytes"):
            try:
                return int((self.mem_dir / f).read_text())
            except (OSError, ValueError):
                continue
        return None

    def oom_killed(self) -> int:
        """How many processes the kernel OOM-killed in this cgroup."""
        if self.mem_dir is None:
            return 0
        for f in ("memory.events", "memory.oom_control"):
            try:
                for line in (self.mem_dir / f).read_text().splitlines():
                    k, v = line.split()
                    if k == "oom_kill":
                        return int(v)
            except (OSError, ValueError):
                continue
        return 0

    def pids_limit_hits(self) -> int:
        if self.pids_dir is None:
            return 0
        try:
            for line in (self.pids_dir / "pids.events").read_text().splitlines():
                k, v = line.split()
                if k == "max":
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def limits(self) -> dict:
        """What is in force, read back from the kernel (for the receipt)."""
        def read(d, f):
            try:
                return (d / f).read_text().strip()
            except (OSError, TypeError):
                return None
        mem_file = None if self.mem_dir is None else (
            "memory.max" if self.layout.memory[0] == "v2" else "memory.limit_in_bytes")
        return {"cgroup": str(self.v2), "memory_backend": self.layout.memory[0] if self.mem_dir else None,
                "memory_max": read(self.mem_dir, mem_file) if mem_file else None,
                "pids_backend": self.layout.pids[0] if self.pids_dir else None,
                "pids_max": read(self.pids_dir, "pids.max") if self.pids_dir else None,
                "freeze": (self.v2 / "cgroup.freeze").exists(), "kill": (self.v2 / "cgroup.kill").exists()}

    # -- control -----------------------------------------------------------------------------
    def freeze(self, on: bool = True, timeout: float = 5.0) -> None:
        """Freeze (or thaw) every task; returns once the kernel says the cgroup is (un)frozen."""
        _write(self.v2 / "cgroup.freeze", "1" if on else "0")
        want = f"frozen {1 if on else 0}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if want in (self.v2 / "cgroup.events").read_text():
                    return
            except OSError:
                return  # gone
            time.sleep(0.001)
        raise CgroupError(f"{self.v2} did not {'freeze' if on else 'thaw'} within {timeout} s")

    def frozen(self) -> bool:
        try:
            return "frozen 1" in (self.v2 / "cgroup.events").read_text()
        except OSError:
            return False

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL every process in the cgroup (setsid and double-forked ones too) and wait until empty."""
        try:
            _write(self.v2 / "cgroup.kill", "1")  # the probe requires it (kernel >= 5.14)
        except FileNotFoundError:
            return  # already removed
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.005)

    def remove(self) -> None:
        for d in reversed(self.dirs):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # zombies still being reaped

    def close(self) -> None:
        self.kill()
        self.remove()
