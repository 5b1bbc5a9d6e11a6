"""Run revision code in a hardened sandbox (see README "Security").

bwrap.py: what the revision sees; seccomp.py: the syscall filter; cgroups.py: limits, CPU time,
freeze/kill; probe.py: what this host supports (fail closed); process.py: spawning and tree helpers;
disk.py: the cap on what a revision writes to host disk.
"""
from worker.sandbox.bwrap import SCRATCH, SandboxSpec
from worker.sandbox.cgroups import RevisionCgroup
from worker.sandbox.disk import DiskWatch, empty
from worker.sandbox.probe import Isolation, SandboxUnavailable, detect_isolation
from worker.sandbox.process import (ENV_ALLOW, kill_tree, pin_tree, scrubbed_env, spawn, tree_pids, tree_rss,
                                    tree_usage)

__all__ = ["SCRATCH", "SandboxSpec", "RevisionCgroup", "DiskWatch", "empty", "Isolation", "SandboxUnavailable", "detect_isolation",
           "ENV_ALLOW", "kill_tree", "pin_tree", "scrubbed_env", "spawn", "tree_pids", "tree_rss", "tree_usage"]
