"""The bubblewrap command line for one revision: what it may see, and nothing else.

Read-only: /usr (and the /bin, /lib* links into it), the interpreter prefix and its
site-packages, the revision's worktree, the trusted driver, the model files. Fresh: /dev
(plus only the NVIDIA nodes in GPU mode), /proc of its own PID namespace, size-capped tmpfs
/tmp and /scratch (tmpfs pages count against the cgroup's memory limit). Never bound: /run,
/var, /home, /root, /etc (but for a two-line passwd/group and the loader cache), sockets, the
service's settings or database files. Every namespace is new; the user is 65534 with no
capabilities; a seccomp filter (worker/sandbox/seccomp.py) is loaded by FD.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_UID = 65534
SCRATCH = "/scratch"  # inside the sandbox: HOME, caches, the revision's only disk
PASSWD = f"nobody:x:{SANDBOX_UID}:{SANDBOX_UID}:nobody:{SCRATCH}:/usr/sbin/nologin\n"
GROUP = f"nogroup:x:{SANDBOX_UID}:\n"
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache",)
GPU_SYS = ("/sys/bus/pci", "/sys/devices", "/sys/module/nvidia", "/sys/class/drm")


@dataclass
class SandboxSpec:
    scratch: Path | None = None  # host scratch: used only when no bubblewrap runs (dev override)
    read_only: list[Path] = field(default_factory=list)
    # Host directories the revision may write (e.g. a per-revision Triton cache). Each is bound
    # read-write at the same path; not size-capped by the sandbox: give it a quota'd directory.
    writable: list[Path] = field(default_factory=list)
    hide: list[Path] = field(default_factory=list)  # kept for callers: nothing is visible unless bound
    gpu: bool = False
    memory_limit_bytes: int | None = None  # cgroup memory limit (includes tmpfs)
    pids_max: int = 256
    tmp_bytes: int = 256 << 20
    scratch_bytes: int = 1 << 30
    cpus: set[int] | None = None
    env_extra: dict[str, str] = field(default_factory=dict)
    name: str = "revision"


def gpu_device_nodes() -> list[str]:
    return sorted(p for p in glob.glob("/dev/nvidia*") if not os.path.isdir(p)) + (
        ["/dev/nvidia-caps"] if os.path.isdir("/dev/nvidia-caps") else [])


def _ordered(paths) -> list[Path]:
    """Unique, existing, parents before children (a later bind may sit inside an earlier one)."""
    return sorted({Path(p) for p in paths if Path(p).exists()}, key=lambda p: len(p.parts))


def bwrap_argv(argv: list[str], spec: SandboxSpec, *, seccomp_fd: int, passwd_fd: int, group_fd: int,
               disable_userns: bool = True) -> list[str]:
    w = ["bwrap", "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
         "--unshare-cgroup", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL",
         "--new-session", "--die-with-parent", "--hostname", "sandbox"]
    if disable_userns:
        w.append("--disable-userns")
    w += ["--ro-bind", "/usr", "/usr"]
    for p in SYSTEM_LINKS:
        if os.path.islink(p):
            w += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            w += ["--ro-bind", p, p]
    for p in ETC_FILES:
        if os.path.exists(p):
            w += ["--ro-bind", p, p]
    w += ["--ro-bind-data", str(passwd_fd), "/etc/passwd", "--ro-bind-data", str(group_fd), "/etc/group"]
    w += ["--proc", "/proc", "--dev", "/dev"]
    if spec.gpu:
        for node in gpu_device_nodes():
            w += ["--dev-bind", node, node]
        for p in GPU_SYS:
            if os.path.exists(p):
                w += ["--ro-bind", p, p]
    w += ["--perms", "1777", "--size", str(spec.tmp_bytes), "--tmpfs", "/tmp",
          "--perms", "0755", "--size", str(spec.scratch_bytes), "--tmpfs", SCRATCH]
    for p in _ordered(spec.read_only):
        if not str(p).startswith("/usr/"):
            w += ["--ro-bind", str(p), str(p)]
    for p in _ordered(spec.writable):
        w += ["--bind", str(p), str(p)]
    # The root tmpfs bwrap builds (and the parent dirs it made for the binds) becomes read-only:
    # /tmp, /scratch and `writable` are the only places a revision can write.
    w += ["--remount-ro", "/", "--chdir", SCRATCH, "--seccomp", str(seccomp_fd), "--"]
    return w + argv


def bind_sources(spec: SandboxSpec) -> list[Path]:
    return [Path("/usr"), *(Path(p) for p in ETC_FILES if os.path.exists(p)), *_ordered(spec.read_only),
            *_ordered(spec.writable)]
