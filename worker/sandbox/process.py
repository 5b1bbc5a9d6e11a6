"""Start a revision's process inside the sandbox, and the process-tree helpers the harness uses."""
from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import time
from pathlib import Path

import psutil

from worker.sandbox import bwrap, seccomp
from worker.sandbox.bwrap import SandboxSpec
from worker.sandbox.cgroups import RevisionCgroup
from worker.sandbox.probe import Isolation, SandboxUnavailable, detect_isolation

# Environment a revision may see; everything else (tokens, DB URLs, cloud keys) is dropped.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
             "CUDA_HOME", "LD_LIBRARY_PATH", "TRITON_INTERPRET", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def scrubbed_env(home: str, tmp: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update({
        "HOME": home, "TMPDIR": tmp, "XDG_CACHE_HOME": f"{home}/.cache", "USER": "nobody",
        "TRITON_CACHE_DIR": f"{home}/.triton", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
    })
    env.update(extra or {})
    return env


def world_reachable(path: Path) -> bool:
    """Can an unprivileged uid reach `path` (search bits on every ancestor, read on the leaf)?"""
    path = Path(path)
    try:
        for anc in reversed(path.parents):
            if not os.stat(anc).st_mode & stat.S_IXOTH:
                return False
        st = os.stat(path)
    except OSError:
        return False
    return bool(st.st_mode & stat.S_IROTH) and (not stat.S_ISDIR(st.st_mode) or bool(st.st_mode & stat.S_IXOTH))


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # not CLOEXEC-free by default: pass_fds makes it inheritable
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _hand_over(dirs, uid: int) -> None:
    """The revision's writable directories (its own SHA's compile cache) belong to the host uid it
    runs as: 65534 where every bound path allows it, else root without capabilities. A cache made
    under the other uid is unwritable (seen on the H200: PermissionError in Triton).

    Another process of the same SHA may be running in the cache meanwhile and swap a directory for a link to
    a host one: every step is relative to a directory fd (os.fwalk), so no path is re-resolved and no link
    is followed (a path-based lchown of `dir/name` follows a swapped-in `dir`)."""
    for top in dirs:
        for _root, subdirs, files, dfd in os.fwalk(top):
            if os.fstat(dfd).st_uid != uid:
                os.fchown(dfd, uid, uid)
            for name in subdirs + files:
                try:
                    if os.stat(name, dir_fd=dfd, follow_symlinks=False).st_uid != uid:
                        os.chown(name, uid, uid, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    pass  # removed meanwhile


def _preexec(cg: RevisionCgroup | None, cpus: set[int] | None, as_limit: int | None, drop_uid: bool, fsize: int):
    def apply():
        if cg is not None:
            cg.attach_self()  # before exec: nothing of the revision ever runs outside its cgroup
        if cpus:
            os.sched_setaffinity(0, cpus)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))  # also caps the stderr log on the host
        if as_limit:
            resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))
        if drop_uid and os.getuid() == 0:
            os.setgroups([])
            os.setgid(bwrap.SANDBOX_UID)
            os.setuid(bwrap.SANDBOX_UID)
    return apply


def spawn(argv: list[str], spec: SandboxSpec, *, pass_fds=(), stdin=subprocess.PIPE, log_path: Path,
          allow_degraded: bool = False, rlimit_as: int | None = None) -> subprocess.Popen:
    """Start argv sandboxed in its own cgroup and session; stderr goes to log_path.

    Without the full sandbox this raises SandboxUnavailable, unless allow_degraded (the
    development override), which uses whatever layers work. The Popen gets `.cgroup` (or None)
    and `.isolation` (what this process actually ran under).
    """
    iso = detect_isolation()
    if not iso.full and not allow_degraded:
        raise SandboxUnavailable(iso.reason or "the sandbox is incomplete")
    cg = None
    if iso.cgroups:
        cg = RevisionCgroup(iso.layout, spec.name, memory_max=spec.memory_limit_bytes, pids_max=spec.pids_max)
    fds: list[int] = []
    drop_uid = False
    try:
        if iso.bwrap:
            fds = [_memfd("seccomp", seccomp.build_filter()), _memfd("passwd", bwrap.PASSWD.encode()),
                   _memfd("group", bwrap.GROUP.encode())]
            drop_uid = all(world_reachable(p) for p in bwrap.bind_sources(spec))
            if os.getuid() == 0:
                _hand_over(spec.writable, bwrap.SANDBOX_UID if drop_uid else 0)
            cmd = bwrap.bwrap_argv(argv, spec, seccomp_fd=fds[0], passwd_fd=fds[1], group_fd=fds[2],
                                   disable_userns=iso.disable_userns)
            env = scrubbed_env(bwrap.SCRATCH, "/tmp", spec.env_extra)
            cwd = "/"
        else:
            if spec.scratch is None:
                raise SandboxUnavailable("no bubblewrap and no host scratch directory given")
            spec.scratch.mkdir(parents=True, exist_ok=True)
            cmd, env, cwd = argv, scrubbed_env(str(spec.scratch), str(spec.scratch), spec.env_extra), str(spec.scratch)
        with open(log_path, "wb") as log:
            p = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=cwd,
                                 pass_fds=(*pass_fds, *fds), start_new_session=True, close_fds=True,
                                 preexec_fn=_preexec(cg, spec.cpus, rlimit_as, drop_uid,
                                                     max(spec.tmp_bytes, spec.scratch_bytes)))
    except BaseException:
        if cg is not None:
            cg.close()
        raise
    finally:
        for fd in fds:
            os.close(fd)
    p.cgroup = cg
    p.isolation = {**iso.to_dict(), "host_uid": bwrap.SANDBOX_UID if drop_uid else os.getuid(),
                   "limits": cg.limits() if cg else None}
    return p


_TREE_CACHE: dict[int, tuple[float, list[int]]] = {}


def tree_pids(pid: int, max_age_s: float = 0.0) -> list[int]:
    """pid and its descendants (psutil scans all of /proc; callers in hot loops pass max_age_s)."""
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
    """Kill the whole cgroup (setsid'd and double-forked children too); else the process group."""
    cg = getattr(proc, "cgroup", None)
    if cg is not None:
        if cg.frozen():
            pass  # SIGKILL reaches frozen tasks too
        cg.kill()
        return
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


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of pid's tree (threads made later inherit it)."""
    for q in tree_pids(pid):
        try:
            tasks = os.listdir(f"/proc/{q}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                os.sched_setaffinity(int(t), cpus)
            except (ProcessLookupError, PermissionError):
                pass  # the thread ended meanwhile
