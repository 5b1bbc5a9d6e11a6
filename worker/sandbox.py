"""Run revision code in a subprocess: scrubbed environment, no network, time and memory limits.

Isolation is the best this host allows, tried in order: bubblewrap (`bwrap`: read-only root,
home hidden, fresh /tmp, its own network/PID/IPC namespaces), plain `unshare --net`, or nothing.
What was used is recorded in the receipt (`Isolation`), so an unisolated run is never silent.
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import psutil

# Environment a revision may see; everything else (tokens, DB URLs, cloud keys) is dropped.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
             "CUDA_HOME", "LD_LIBRARY_PATH", "TRITON_INTERPRET", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class Isolation:
    method: str  # "bwrap" | "unshare" | "none"
    network_isolated: bool
    reason: str | None = None  # why a stronger method was not used

    def to_dict(self) -> dict:
        return asdict(self)


def _works(argv: list[str]) -> tuple[bool, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return p.returncode == 0, (p.stderr or p.stdout).strip()[-300:]


@lru_cache(maxsize=1)
def detect_isolation() -> Isolation:
    """Probe once per process which sandbox this host can actually run."""
    reasons = []
    if shutil.which("bwrap"):
        ok, err = _works(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                          "--unshare-net", "--unshare-pid", "--die-with-parent", "true"])
        if ok:
            return Isolation("bwrap", True)
        reasons.append(f"bwrap failed: {err}")
    else:
        reasons.append("bwrap not installed (Debian package bubblewrap)")
    if shutil.which("unshare"):
        ok, err = _works(["unshare", "--net", "true"])
        if ok:
            return Isolation("unshare", True, "; ".join(reasons))
        reasons.append(f"unshare --net failed: {err}")
    else:
        reasons.append("unshare not installed")
    return Isolation("none", False, "; ".join(reasons) + "; revision ran WITH network access")


def scrubbed_env(scratch: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update({
        "HOME": str(scratch), "TMPDIR": str(scratch), "XDG_CACHE_HOME": str(scratch / ".cache"),
        "TRITON_CACHE_DIR": str(scratch / ".triton"), "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
    })
    env.update(extra or {})
    return env


@dataclass
class SandboxSpec:
    scratch: Path  # writable, per process
    read_only: list[Path] = field(default_factory=list)  # must stay visible even if under a hidden path
    hide: list[Path] = field(default_factory=list)  # replaced by empty tmpfs (home, secrets)
    gpu: bool = False
    memory_limit_bytes: int | None = None
    cpus: set[int] | None = None  # CPU affinity; base and head share it so they meet the same contention
    env_extra: dict[str, str] = field(default_factory=dict)
    # Further writable directories (the revision's own compile cache, worker/compile_cache.py).
    writable: list[Path] = field(default_factory=list)


def wrap_argv(argv: list[str], spec: SandboxSpec, iso: Isolation) -> list[str]:
    if iso.method == "bwrap":
        w = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc",
             *(["--dev-bind", "/dev", "/dev"] if spec.gpu else ["--dev", "/dev"]), "--tmpfs", "/tmp"]
        for h in spec.hide:
            if h.is_dir():
                w += ["--tmpfs", str(h)]
        for p in spec.read_only:
            w += ["--ro-bind", str(p), str(p)]
        for p in spec.writable:
            w += ["--bind", str(p), str(p)]
        w += ["--bind", str(spec.scratch), str(spec.scratch), "--chdir", str(spec.scratch),
              "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--"]
        return w + argv
    if iso.method == "unshare":
        return ["unshare", "--net", "--"] + argv
    return argv


def _limits(memory_limit_bytes: int | None, cpus: set[int] | None):
    def apply():
        if cpus:
            os.sched_setaffinity(0, cpus)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    return apply


def spawn(argv: list[str], spec: SandboxSpec, *, pass_fds=(), stdin=subprocess.PIPE, log_path: Path) -> subprocess.Popen:
    """Start argv sandboxed in its own session (process group); stderr goes to log_path."""
    spec.scratch.mkdir(parents=True, exist_ok=True)
    iso = detect_isolation()
    log = open(log_path, "wb")
    try:
        return subprocess.Popen(
            wrap_argv(argv, spec, iso), stdin=stdin, stdout=subprocess.DEVNULL, stderr=log,
            env=scrubbed_env(spec.scratch, spec.env_extra), cwd=str(spec.scratch), pass_fds=pass_fds,
            start_new_session=True, preexec_fn=_limits(spec.memory_limit_bytes, spec.cpus), close_fds=True,
        )
    finally:
        log.close()


_TREE_CACHE: dict[int, tuple[float, list[int]]] = {}


def tree_pids(pid: int, max_age_s: float = 0.0) -> list[int]:
    """pid and its descendants (psutil scans all of /proc; callers in hot loops pass max_age_s)."""
    import time

    now = time.monotonic()
    hit = _TREE_CACHE.get(pid)
    if hit and now - hit[0] <= max_age_s:
        return hit[1]
    try:
        p = psutil.Process(pid)
        pids = [pid] + [c.pid for c in p.children(recursive=True)]
    except psutil.Error:
        pids = []
    _TREE_CACHE[pid] = (now, pids)
    if len(_TREE_CACHE) > 256:
        _TREE_CACHE.clear()
    return pids


def tree_rss(pid: int) -> int | None:
    total = 0
    for q in tree_pids(pid, max_age_s=2.0):
        try:
            total += psutil.Process(q).memory_info().rss
        except psutil.Error:
            pass
    return total or None


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill the whole process group, plus any descendant that left it (setsid)."""
    pids = tree_pids(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for q in pids:
        try:
            os.kill(q, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def tree_usage(pid: int) -> dict:
    """Kernel accounting for a live process tree: CPU seconds and the largest peak RSS (VmHWM)."""
    user = system = 0.0
    hwm = 0
    for q in tree_pids(pid):
        try:
            t = psutil.Process(q).cpu_times()
            user, system = user + t.user, system + t.system
            with open(f"/proc/{q}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) * 1024)
        except (psutil.Error, OSError, ValueError):
            pass
    return {"cpu_user_s": user, "cpu_system_s": system, "max_rss_bytes": hwm or None}


def _tree_threads(pid: int, **kw):
    """(process, thread id) of every thread of pid's tree still there (kw: tree_pids' options)."""
    for q in tree_pids(pid, **kw):
        try:
            tasks = os.listdir(f"/proc/{q}/task")
        except OSError:
            continue
        for t in tasks:
            yield q, t


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of pid's tree (threads made later inherit it)."""
    for _, t in _tree_threads(pid):
        try:
            os.sched_setaffinity(int(t), cpus)
        except ProcessLookupError:
            pass  # the thread ended meanwhile


def tree_oncpu_ns(pid: int) -> int | None:
    """Nanoseconds the tree's threads have run on a CPU (/proc/<pid>/task/*/schedstat)."""
    total, seen = 0, False
    for q, t in _tree_threads(pid, max_age_s=2.0):
        try:
            with open(f"/proc/{q}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
                seen = True
        except (OSError, ValueError, IndexError):
            pass
    return total if seen else None
