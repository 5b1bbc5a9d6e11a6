"""Parent side of the harness: start a sandboxed driver for one revision and time its requests.

Every duration used by a gate is `perf_counter` around one request, taken here: the request is
written, the child does the work and synchronises its device, the answer is read. The child
never reports a time.
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from worker import sandbox

DRIVER_SRC = Path(__file__).with_name("driver.py")


class RevisionFault(Exception):
    """The revision's process did not give a usable answer.

    kind: import | protocol | load | oom | error | timeout | crashed | sandbox
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
    writable: list[Path] = field(default_factory=list)  # beyond its scratch (its compile cache)
    secrets: list[str] = field(default_factory=list)  # values redacted from any log tail we return

    def __post_init__(self):
        self.proc = None
        self._buf = b""
        self.usage = ProcessUsage()
        self.hello: dict = {}
        self.track_cpu = False  # measure on-CPU time of each request too (CPU profiles)
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
        self.scratch.mkdir(parents=True, exist_ok=True)
        shutil.copy(DRIVER_SRC, driver_dir / "driver.py")
        r, w = os.pipe()
        spec = sandbox.SandboxSpec(
            scratch=self.scratch, read_only=[self.root, driver_dir, *self.read_only], hide=self.hide,
            gpu=self.gpu, memory_limit_bytes=self.memory_limit_bytes, cpus=self.cpus if self.pin_at_start else None, env_extra=self.env_extra,
            writable=self.writable)
        argv = [sys.executable, "-I", str(driver_dir / "driver.py"), str(self.root), str(w)]
        try:
            self.proc = sandbox.spawn(argv, spec, pass_fds=(w,), log_path=self.log_path)
        except OSError as exc:
            os.close(r)
            os.close(w)
            raise RevisionFault(self.role, "start", "sandbox", f"could not start the sandbox: {exc}") from exc
        os.close(w)
        self._rfd = r
        os.set_blocking(r, False)
        self.begin("hello")
        if timeout is not None:
            return self.finish_start(timeout)

    def finish_start(self, timeout: float) -> dict:
        self.hello = self.finish(phase="start", timeout=timeout)[0]
        return self.hello

    def pin(self) -> None:
        """Move the whole process tree onto `cpus` (a no-op without a set)."""
        if not self.cpus or self.proc is None:
            return
        try:
            sandbox.pin_tree(self.proc.pid, self.cpus)
        except OSError as exc:
            raise RevisionFault(self.role, "measure", "sandbox", f"could not pin to CPUs {sorted(self.cpus)}: {exc}")

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            u = sandbox.tree_usage(self.proc.pid)  # before exit: the sandbox's own rusage misses its children
            self.usage.cpu_user_s, self.usage.cpu_system_s = u["cpu_user_s"], u["cpu_system_s"]
            self.usage.max_rss_bytes = u["max_rss_bytes"]
            try:
                self._send({"op": "exit"})
                self._read_line(5.0, "exit")
            except (RevisionFault, OSError):
                pass
            deadline = time.monotonic() + 5  # let it exit by itself so its rusage reaches us
            while self.proc.returncode is None and time.monotonic() < deadline:
                if not self._reap(block=False):
                    time.sleep(0.02)
            if self.proc.returncode is None:
                sandbox.kill_tree(self.proc)
                self._reap()
        try:
            os.close(self._rfd)
        except OSError:
            pass
        self.proc = None

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
        if self.usage.cpu_user_s is None:
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
        self._cpu0 = sandbox.tree_oncpu_ns(self.proc.pid) if self.track_cpu else None
        self._t0 = time.perf_counter()
        self._send({"op": op, "seq": self._seq, **kw})

    def finish(self, *, phase: str, timeout: float) -> tuple[dict, float]:
        line = self._read_line(timeout, phase)
        elapsed = time.perf_counter() - self._t0
        cpu1 = sandbox.tree_oncpu_ns(self.proc.pid) if self.track_cpu else None
        cpu0 = self._cpu0
        self.last_oncpu_s = (cpu1 - cpu0) / 1e9 if cpu0 is not None and cpu1 is not None else None
        self._sample_rss()
        try:
            resp = json.loads(line)
        except json.JSONDecodeError:
            raise RevisionFault(self.role, phase, "protocol", f"unreadable answer {line[:200]!r}") from None
        if resp.get("seq") != self._seq:
            sandbox.kill_tree(self.proc)
            self._reap()
            raise RevisionFault(self.role, phase, "protocol", f"answer out of sequence (seq {resp.get('seq')!r}, "
                                f"expected {self._seq}): something other than the harness wrote to its channel")
        if not resp.get("ok"):
            kind = resp.get("kind", "error")
            detail = resp.get("error", "no detail")
            raise RevisionFault(self.role, phase, kind, self._redact(detail),
                                self._redact(resp.get("trace", "") + "\n" + self.log_tail()))
        return resp, elapsed

    def _send(self, msg: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._died("send")

    def _read_line(self, timeout: float, phase: str) -> str:
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self._rfd, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    sandbox.kill_tree(self.proc)
                    self._reap()
                    raise RevisionFault(self.role, phase, "timeout", f"no answer within {timeout:.0f} s; "
                                        "process group killed", self.log_tail())
                if sel.select(min(left, 0.5)):
                    chunk = os.read(self._rfd, 1 << 16)
                    if not chunk:
                        self._died(phase)
                    self._buf += chunk
                else:
                    self._watch_memory(phase)
        finally:
            sel.close()
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def cpu_seconds(self) -> float | None:
        """On-CPU time the revision's process tree has used so far (kernel accounting, ns)."""
        if self.proc is None or self.proc.returncode is not None:
            return None
        ns = sandbox.tree_oncpu_ns(self.proc.pid)
        return ns / 1e9 if ns is not None else None

    def _sample_rss(self) -> int | None:
        rss = sandbox.tree_rss(self.proc.pid)
        if rss:
            self.usage.peak_tree_rss_bytes = max(self.usage.peak_tree_rss_bytes or 0, rss)
        return rss

    def _watch_memory(self, phase: str) -> None:
        rss = self._sample_rss()
        if rss and self.memory_limit_bytes and rss > self.memory_limit_bytes:
            sandbox.kill_tree(self.proc)
            self._reap()
            raise RevisionFault(self.role, phase, "oom", f"resident memory {rss >> 20} MiB over the "
                                f"{self.memory_limit_bytes >> 20} MiB limit; killed", self.log_tail())

    def _died(self, phase: str):
        deadline = time.monotonic() + 2.0  # the channel closed: give it a moment to exit by itself
        while not self._reap(block=False) and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.proc.returncode is None:
            sandbox.kill_tree(self.proc)  # make sure nothing of it lingers
            self._reap()
        code = self.proc.returncode
        tail = self.log_tail()
        kind = "oom" if ("MemoryError" in tail or "out of memory" in tail.lower() or code == -9) else "crashed"
        raise RevisionFault(self.role, phase, kind, f"process exited (status {code}) without answering", tail)

    def log_tail(self, n: int = 3000) -> str:
        try:
            data = self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""
        return self._redact(data)

    def _redact(self, text: str) -> str:
        for s in self.secrets:
            if s and len(s) >= 6:
                text = text.replace(s, "[redacted]")
        return text
