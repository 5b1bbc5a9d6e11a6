"""Parent side of the harness: start a sandboxed driver for one revision and time its requests.

Every duration used by a gate is `perf_counter` around one request, taken here: the request is
written, the child does the work and synchronises its device, the answer is read. The child
never reports a time. On-CPU time comes from the revision's own cgroup (`cpu.stat`: every thread
and child that ever ran in it). Answers are bounded, length-prefixed frames read with deadlines
(frames.py); logits arrive in shared memory this process allocated (shm.py), and every reduction
of them (argmax, finiteness, KL) is computed here.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from worker import compile_cache, sandbox
from worker.harness import frames
from worker.harness.shm import DEFAULT_CAPACITY, LogitsBuffer

DRIVER_SRC = Path(__file__).with_name("driver.py")


# The fault kinds a revision's own answer may carry (what driver.py says); every other kind (sandbox, timeout,
# crashed, ...) is the parent's finding alone (worker/verdicts/faults.py makes some of them INFRA).
ANSWER_KINDS = frozenset({"import", "protocol", "oom", "error"})
# What the worker reads of a hello: the rest, and anything the worker fills in itself (load_seconds, pinned), the
# revision could forge in its own answers (it can rewrite the driver's frame writer from import time on).
HELLO_FIELDS = ("protocol", "runtime_file", "python", "torch", "triton", "driver")
TEXT_CAP = 200  # a version or path string in a report; longer is the revision's noise


class RevisionFault(Exception):
    """The revision's process did not give a usable answer.

    kind: import | protocol | load | oom | error | timeout | crashed | sandbox | sandbox_unavailable
    """

    def __init__(self, role: str, phase: str, kind: str, detail: str, log_tail: str = ""):
        super().__init__(f"{role} {phase}: {kind}: {detail}")
        self.role, self.phase, self.kind, self.detail, self.log_tail = role, phase, kind, detail, log_tail


@dataclass
class ProcessUsage:
    max_rss_bytes: int | None = None
    cpu_user_s: float | None = None
    cpu_system_s: float | None = None
    peak_tree_rss_bytes: int | None = None
    exit_status: int | None = None
    # op -> [answered requests, seconds the parent measured around them]: where a process's time went (the
    # reference's output checks are most of a 9B evaluation's verify phase, gpu-e2e-h100-20261206T192305Z.json)
    op_seconds: dict[str, list] = field(default_factory=dict)


@dataclass
class RevisionProcess:
    role: str  # "base" | "head" | "reference"
    root: Path  # the revision's worktree (its `runtime` package lives here)
    workdir: Path
    gpu: bool = False
    memory_limit_bytes: int | None = None
    cpus: set[int] | None = None  # affinity while measured (see pin)
    pin_at_start: bool = True  # False: start and load on every allowed core, pin() before timing
    hide: list[Path] = field(default_factory=list)
    read_only: list[Path] = field(default_factory=list)
    env_extra: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)  # values redacted from any log tail we return
    writable: list[Path] = field(default_factory=list)  # extra host dirs bound read-write (e.g. a compile cache)
    disk_max_bytes: int = compile_cache.MAX_BYTES_PER_REVISION  # what it may leave in `writable` (sandbox/disk.py)
    disk_max_entries: int = compile_cache.MAX_ENTRIES_PER_REVISION
    pids_max: int = 256
    allow_degraded: bool = False  # the development override: run under whatever sandbox layers work
    logits_capacity: int = DEFAULT_CAPACITY

    def __post_init__(self):
        self.proc = None
        self.cgroup = None
        self.shm: LogitsBuffer | None = None
        self.vocab: int | None = None
        self.isolation: dict | None = None
        self.usage = ProcessUsage()
        self.hello: dict = {}
        self.track_cpu = False  # measure on-CPU time of each request too (CPU profiles)
        self._disk: sandbox.DiskWatch | None = None
        self.last_oncpu_s: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def scratch(self) -> Path:
        return self.workdir / "scratch"

    @property
    def log_path(self) -> Path:
        return self.workdir / "stderr.log"

    def start(self, timeout: float | None) -> dict | None:
        """Spawn the sandboxed driver and say hello (timeout None: do not wait; see finish_start)."""
        driver_dir = self.workdir / "driver"
        driver_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(DRIVER_SRC, driver_dir / "driver.py")
        self.shm = LogitsBuffer(self.logits_capacity)
        r, w = os.pipe()
        spec = sandbox.SandboxSpec(
            scratch=self.scratch, read_only=[self.root, driver_dir, Path(sys.prefix), Path(sys.base_prefix), *self.read_only], writable=list(self.writable),
            gpu=self.gpu, memory_limit_bytes=self.memory_limit_bytes, pids_max=self.pids_max,
            cpus=self.cpus if self.pin_at_start else None, env_extra=self.env_extra, name=self.role)
        argv = [sys.executable, "-I", str(driver_dir / "driver.py"), str(self.root), str(w), str(self.shm.fd)]
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.proc = sandbox.spawn(argv, spec, pass_fds=(w, self.shm.fd), log_path=self.log_path,
                                      allow_degraded=self.allow_degraded)
        except sandbox.SandboxUnavailable as exc:
            os.close(r)
            os.close(w)
            raise RevisionFault(self.role, "start", "sandbox_unavailable", str(exc)) from exc
        except OSError as exc:
            os.close(r)
            os.close(w)
            raise RevisionFault(self.role, "start", "sandbox", f"could not start the sandbox: {exc}") from exc
        os.close(w)
        if self.writable:
            proc = self.proc
            self._disk = sandbox.DiskWatch(self.writable, self.disk_max_bytes, self.disk_max_entries,
                                           on_breach=lambda: proc.returncode is None and sandbox.kill_tree(proc))
            self._disk.start()
        self.cgroup = getattr(self.proc, "cgroup", None)
        self.isolation = getattr(self.proc, "isolation", None)
        self._rfd = r
        self._reader = frames.FrameReader(r)
        self.begin("hello")
        if timeout is not None:
            return self.finish_start(timeout)

    def finish_start(self, timeout: float) -> dict:
        resp = self.finish(phase="start", timeout=timeout)[0]
        self.hello = {k: resp[k] if type(resp.get(k)) is int else short_text(resp.get(k)) for k in HELLO_FIELDS}
        return self.hello

    def pin(self) -> None:
        """Move the whole process tree onto `cpus` (a no-op without a set)."""
        if not self.cpus or self.proc is None:
            return
        try:
            sandbox.pin_tree(self.proc.pid, self.cpus)
        except OSError as exc:
            raise RevisionFault(self.role, "measure", "sandbox", f"could not pin to CPUs {sorted(self.cpus)}: {exc}")

    def freeze(self, on: bool = True) -> None:
        """Stop (or resume) every thread of the revision: it can neither work off the clock nor
        compete with the revision being timed."""
        if self.cgroup is not None and self.proc is not None:
            try:
                self.cgroup.freeze(on)
            except (OSError, sandbox.cgroups.CgroupError) as exc:
                raise RevisionFault(self.role, "measure", "sandbox", f"could not {'freeze' if on else 'thaw'}: {exc}")

    def close(self) -> None:
        if self.proc is None:
            return
        breach = self._disk.stop() if self._disk is not None else None  # no kill from the watch once it is reaped
        if self.proc.returncode is None:
            self.freeze(False)
            self._account()
            try:
                self._send({"op": "exit", "seq": -1})
                self._reader.read(5.0)
            except (RevisionFault, frames.FrameError, OSError):
                pass
            deadline = time.monotonic() + 5  # let it exit by itself so its rusage reaches us
            while self.proc.returncode is None and time.monotonic() < deadline:
                if not self._reap(block=False):
                    time.sleep(0.02)
        self._account()
        # Whatever it left behind (daemons, setsid'd or double-forked children) dies with its cgroup.
        sandbox.kill_tree(self.proc)
        if self.proc.returncode is None:
            self._reap()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self._disk is not None and (breach or self._disk.check()):
            sandbox.empty(self.writable)  # over its cap: nothing of it stays on the host
        try:
            os.close(self._rfd)
        except OSError:
            pass
        if self.shm is not None:
            self.shm.close()
            self.shm = None
        self.proc = None

    def _account(self) -> None:
        """CPU and peak memory from the cgroup (covers exited threads and children)."""
        if self.cgroup is not None:
            ns = self.cgroup.cpu_usage_ns()
            if ns is not None:
                self.usage.cpu_user_s = ns / 1e9  # user+system: cpu.stat usage
                self.usage.cpu_system_s = 0.0
            peak = self.cgroup.memory_peak()
            if peak:
                self.usage.max_rss_bytes = peak
        elif self.proc.returncode is None:
            u = sandbox.tree_usage(self.proc.pid)
            self.usage.cpu_user_s, self.usage.cpu_system_s = u["cpu_user_s"], u["cpu_system_s"]
            self.usage.max_rss_bytes = u["max_rss_bytes"]

    def _reap(self, block: bool = True) -> bool:
        """wait4 the sandbox process (its rusage covers the children it waited for)."""
        if self.proc.returncode is not None:
            return True
        try:
            pid, status, ru = os.wait4(self.proc.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.proc.poll()
            return self.proc.returncode is not None
        if pid == 0:
            return False
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        if self.usage.cpu_user_s is None and self.cgroup is None:
            self.usage.max_rss_bytes = ru.ru_maxrss * 1024
            self.usage.cpu_user_s, self.usage.cpu_system_s = ru.ru_utime, ru.ru_stime
        self.usage.exit_status = self.proc.returncode
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- requests ----------------------------------------------------------------------------
    def request(self, op: str, *, phase: str, timeout: float, **kw) -> tuple[dict, float]:
        """Send one request; return (answer, seconds the parent measured around it)."""
        self.begin(op, **kw)
        return self.finish(phase=phase, timeout=timeout)

    def begin(self, op: str, **kw) -> None:
        """Write a request (its clock starts here); `finish` reads the answer."""
        if self.proc is None:
            raise RevisionFault(self.role, op, "crashed", "process not running")
        self._seq = getattr(self, "_seq", 0) + 1
        self._cpu0 = self._cpu_ns() if self.track_cpu else None
        self._t0, self._op = time.perf_counter(), op
        self._send({"op": op, "seq": self._seq, **kw})

    def finish(self, *, phase: str, timeout: float) -> tuple[dict, float]:
        resp = self._read(timeout, phase)
        elapsed = time.perf_counter() - self._t0
        calls = self.usage.op_seconds.setdefault(self._op, [0, 0.0])
        calls[0], calls[1] = calls[0] + 1, calls[1] + elapsed
        cpu0 = self._cpu0
        cpu1 = self._cpu_after(cpu0) if self.track_cpu else None
        self.last_oncpu_s = (cpu1 - cpu0) / 1e9 if cpu0 is not None and cpu1 is not None else None
        self._sample_rss()
        if resp.get("seq") != self._seq:
            self._kill()
            raise RevisionFault(self.role, phase, "protocol", f"answer out of sequence (seq {str(resp.get('seq'))[:40]!r}, "
                                f"expected {self._seq}): something other than the harness wrote to its channel")
        if resp.get("ok") is not True:
            kind = str(resp.get("kind", "error"))[:40]
            detail = str(resp.get("error", "no detail"))[:2000]
            if kind not in ANSWER_KINDS:  # e.g. "sandbox": INFRA, never the PR's, so never the revision's word
                detail = (f"answered a fault of kind {kind!r}, which only the worker decides (the driver says "
                          f"{'/'.join(sorted(ANSWER_KINDS))}): {detail}")
                kind = "protocol"
            raise RevisionFault(self.role, phase, kind, self._redact(detail),
                                self._redact(str(resp.get("trace", ""))[-4000:] + "\n" + self.log_tail()))
        if "vocab_size" in resp or phase == "load":
            vocab = resp.get("vocab_size")
            if type(vocab) is not int or vocab <= 0:
                self._kill()
                raise RevisionFault(self.role, phase, "protocol",
                                    f"vocab_size {str(vocab)[:40]!r} in its answer is not a positive integer")
            self.vocab = vocab
        return resp, elapsed

    def read_logits(self, resp: dict, rows: int, phase: str) -> np.ndarray:
        """rows x vocab float32 logits the last answer put in shared memory (shape checked here)."""
        shape = resp.get("shape")
        want = [rows, self.vocab] if rows > 1 else None
        ok = isinstance(shape, list) and all(isinstance(x, int) for x in shape) and (
            shape == want if want else shape in ([self.vocab], [1, self.vocab]))
        if not ok or self.vocab is None:
            raise RevisionFault(self.role, phase, "protocol", f"logits of shape {str(shape)[:80]}, expected "
                                f"{want or [self.vocab]}")
        try:
            return self.shm.read(rows, self.vocab)
        except ValueError as exc:
            raise RevisionFault(self.role, phase, "protocol", str(exc)) from None

    def _send(self, msg: dict) -> None:
        try:
            self.proc.stdin.write(frames.encode(msg))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._died("send")

    def _kill(self) -> None:
        sandbox.kill_tree(self.proc)
        self._reap()

    def _read(self, timeout: float, phase: str) -> dict:
        try:
            return self._reader.read(timeout, on_idle=lambda: self._watch_memory(phase))
        except frames.FrameError as exc:
            if exc.kind == "closed":
                self._died(phase)
            self._kill()
            if exc.kind == "timeout":
                raise RevisionFault(self.role, phase, "timeout", f"no answer within {timeout:.0f} s; "
                                    "process tree killed", self.log_tail()) from None
            raise RevisionFault(self.role, phase, "protocol", f"{exc.detail}; process tree killed",
                                self.log_tail()) from None

    def _cpu_ns(self) -> int | None:
        return self.cgroup.cpu_usage_ns() if self.cgroup is not None else None

    def _cpu_after(self, cpu0: int | None, tries: int = 5) -> int | None:
        """cpu.stat once the request's time is in it: the kernel folds a thread's runtime into its
        cgroup at the next tick or switch, so a sub-millisecond request can read as no time at all
        right after its answer (seen in CI: "the oncpu clock gave 0.0"). Re-read briefly, never wait long."""
        cpu1 = self._cpu_ns()
        for _ in range(tries):
            if cpu0 is None or cpu1 is None or cpu1 > cpu0:
                break
            time.sleep(0.002)
            cpu1 = self._cpu_ns()
        return cpu1

    def cpu_seconds(self) -> float | None:
        """On-CPU time the revision's cgroup has used so far (None without a cgroup)."""
        if self.proc is None or self.proc.returncode is not None:
            return None
        ns = self._cpu_ns()
        return ns / 1e9 if ns is not None else None

    def _sample_rss(self) -> int | None:
        rss = sandbox.tree_rss(self.proc.pid)
        if rss:
            self.usage.peak_tree_rss_bytes = max(self.usage.peak_tree_rss_bytes or 0, rss)
        return rss

    def _watch_memory(self, phase: str) -> None:
        rss = self._sample_rss()
        if self.cgroup is not None:
            return  # the kernel enforces memory.max (tmpfs included); _died reads its OOM count
        if rss and self.memory_limit_bytes and rss > self.memory_limit_bytes:
            sandbox.kill_tree(self.proc)
            self._reap()
            raise RevisionFault(self.role, phase, "oom", f"resident memory {rss >> 20} MiB over the "
                                f"{self.memory_limit_bytes >> 20} MiB limit; killed", self.log_tail())

    def _died(self, phase: str):
        breach = self._disk.stop() if self._disk is not None else None  # killed by the disk watch?
        deadline = time.monotonic() + 2.0  # the channel closed: give it a moment to exit by itself
        while not self._reap(block=False) and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.proc.returncode is None:
            sandbox.kill_tree(self.proc)  # make sure nothing of it lingers
            self._reap()
        code = self.proc.returncode
        tail = self.log_tail()
        if breach:
            raise RevisionFault(self.role, phase, "disk", breach, tail)
        oom_killed = self.cgroup is not None and self.cgroup.oom_killed() > 0
        kind = "oom" if (oom_killed or "MemoryError" in tail or "out of memory" in tail.lower()
                         or (self.cgroup is None and code == -9)) else "crashed"
        raise RevisionFault(self.role, phase, kind, f"process exited (status {code}) without answering", tail)

    def log_tail(self, n: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:  # the parent's own file; only its tail is read
                f.seek(max(0, os.fstat(f.fileno()).st_size - n))
                data = f.read(n).decode(errors="replace")
        except OSError:
            return ""
        return self._redact(data)

    def _redact(self, text: str) -> str:
        for s in self.secrets:
            if s and len(s) >= 6:
                text = text.replace(s, "[redacted]")
        return text


MEMORY_ENTRIES = 16  # a memory report with more entries is not the driver's (worker/harness/driver.py `_memory`)


def bounded_memory(report) -> dict | None:
    """A revision's own memory report for the receipt (the memory gates read NVML, not this): None unless a dict of
    at most MEMORY_ENTRIES entries; keys and text values short, numbers as they are."""
    if not isinstance(report, dict) or len(report) > MEMORY_ENTRIES:
        return None
    return {short_text(k)[:64]: v if type(v) in (int, float) else short_text(v) for k, v in report.items()}


def short_text(value) -> str | None:
    """A revision's string for a report: None stays None, anything else is text of at most TEXT_CAP characters."""
    return None if value is None else str(value)[:TEXT_CAP]
