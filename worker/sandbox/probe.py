"""What sandbox this host can run, found by trying it once per process (fail closed on anything less).

Full = bubblewrap with a user namespace (uid 65534, CapEff 0, no_new_privs, our seccomp filter,
all namespaces new) AND a cgroup (v2 cpu.stat/freeze/kill, memory and pid limits). Anything less
is `full=False` with the reason; the pipeline then returns INFRA sandbox_unavailable unless the
development override is on.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache

from worker.sandbox import cgroups


class SandboxUnavailable(RuntimeError):
    """The full sandbox cannot be set up here; the message says why."""


@dataclass
class Isolation:
    method: str  # e.g. "bwrap+seccomp+cgroup" | "degraded: ..." | "none"
    network_isolated: bool
    full: bool = False
    reason: str | None = None
    bwrap: bool = False
    cgroups: bool = False
    disable_userns: bool = False
    facts: dict = field(default_factory=dict)  # CapEff, NoNewPrivs, Seccomp mode seen inside; cgroup notes
    layout: object = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {"method": self.method, "network_isolated": self.network_isolated, "full": self.full,
                "reason": self.reason, "facts": self.facts}


_INSIDE = ("import os\nst=open('/proc/self/status').read().splitlines()\n"
           "d=dict(l.split(':',1) for l in st if ':' in l)\n"
           "print(os.getuid(), d['CapEff'].strip(), d['NoNewPrivs'].strip(), d['Seccomp'].strip(),"
           " int(os.path.exists('/etc/shadow')), int(os.path.exists('/run')))\n")


def _probe_bwrap() -> tuple[bool, str | None, dict, bool]:
    if not shutil.which("bwrap"):
        return False, "bubblewrap is not installed (Debian package bubblewrap)", {}, False
    from worker.sandbox import process
    from worker.sandbox.bwrap import SandboxSpec

    help_text = subprocess.run(["bwrap", "--help"], capture_output=True, text=True).stdout
    disable_userns = "--disable-userns" in help_text
    spec = SandboxSpec(read_only=[sys.prefix, sys.base_prefix])
    fds = []
    try:
        from worker.sandbox import bwrap, seccomp
        fds = [process._memfd("seccomp", seccomp.build_filter()), process._memfd("p", bwrap.PASSWD.encode()),
               process._memfd("g", bwrap.GROUP.encode())]
        argv = bwrap.bwrap_argv([sys.executable, "-I", "-c", _INSIDE], spec, seccomp_fd=fds[0], passwd_fd=fds[1],
                                group_fd=fds[2], disable_userns=disable_userns)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30, pass_fds=fds,
                           env={"PATH": "/usr/bin:/bin"})
    except seccomp.UnsupportedArch as exc:
        return False, str(exc), {}, disable_userns
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap could not run: {type(exc).__name__}: {exc}", {}, disable_userns
    finally:
        for fd in fds:
            os.close(fd)
    if p.returncode != 0:
        return False, f"bwrap with a user namespace failed: {(p.stderr or p.stdout).strip()[-300:]}", {}, disable_userns
    uid, capeff, nnp, mode, shadow, run = p.stdout.split()
    facts = {"uid_inside": int(uid), "CapEff": capeff, "NoNewPrivs": int(nnp), "Seccomp": int(mode),
             "etc_shadow_visible": bool(int(shadow)), "run_visible": bool(int(run)),
             "bwrap": subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()}
    bad = []
    if int(uid) != 65534:
        bad.append(f"uid {uid}")
    if int(capeff, 16) != 0:
        bad.append(f"CapEff {capeff}")
    if nnp != "1":
        bad.append("no_new_privs off")
    if mode != "2":
        bad.append(f"seccomp mode {mode}")
    if int(shadow) or int(run):
        bad.append("host /etc/shadow or /run visible")
    if bad:
        return False, "bwrap ran but the sandbox is weaker than required: " + ", ".join(bad), facts, disable_userns
    return True, None, facts, disable_userns


def _probe_cgroups() -> tuple[object | None, str | None, dict]:
    try:
        layout = cgroups.discover()
        if layout.memory is None or layout.pids is None:
            raise cgroups.CgroupError("no memory and/or pids controller: " + "; ".join(layout.notes))
        g = cgroups.RevisionCgroup(layout, "probe", memory_max=64 << 20, pids_max=16)
        limits = g.limits()
        g.close()
    except (cgroups.CgroupError, OSError) as exc:
        return None, f"cgroups: {exc}", {}
    return layout, None, {"cgroup": {**limits, "notes": layout.notes}}


@lru_cache(maxsize=1)
def detect_isolation() -> Isolation:
    ok_b, why_b, facts, dis = _probe_bwrap()
    layout, why_c, cfacts = _probe_cgroups()
    facts.update(cfacts)
    reasons = [r for r in (why_b, why_c) if r]
    full = ok_b and layout is not None
    if full:
        method = "bwrap+seccomp+cgroup"
    else:
        method = "degraded: " + (" + ".join(x for x, ok in (("bwrap+seccomp", ok_b), ("cgroup", layout is not None))
                                            if ok) or "none")
    return Isolation(method, ok_b, full, "; ".join(reasons) or None, ok_b, layout is not None, dis, facts, layout)
