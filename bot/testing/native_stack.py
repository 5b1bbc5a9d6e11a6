"""docker-compose.yml's tokengate processes, started natively (no Docker engine runs on these machines).

The compose file is the source: each service's `command` (with `tokengate` run as `python -m bot.cli`
from this checkout) and its `environment`, with compose's `${VAR}` interpolation done from the env file
(.env, as an operator fills it from .env.example). Compose's host names (`postgres`, `redis`), broker
users and mounted secrets are mapped onto this machine by `localize`. Every process runs in its
own process group so teardown can end it with all its children.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

from bot.testing import REPO as ROOT

COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
# What every process needs to run Python from this checkout, and nothing else from the test's environment.
BASE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")


def parse_env_file(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's `${NAME}`, `${NAME:-default}`, `${NAME:?error}` and `$$` from the env file."""
    def one(m: re.Match) -> str:
        name, op, arg = m.group("name"), m.group("op"), m.group("arg")
        if env.get(name):
            return env[name]
        if op and op.endswith("?"):
            raise KeyError(f"{name}: {arg}")
        return arg if op and op.endswith("-") else ""
    return INTERPOLATION.sub(one, value).replace("$$", "$")


def compose_services() -> dict[str, dict]:
    """The services of docker-compose.yml with YAML anchors/merge keys resolved."""
    return yaml.safe_load(COMPOSE.read_text())["services"]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    env: dict[str, str]
    killed: bool = False  # killed or stopped on purpose: never restarted
    cmd: list[str] = field(default_factory=list)
    replaced_by: "Proc | None" = None  # restarted (compose's `restart:` policy) as this one

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.popen.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


@dataclass
class NativeStack:
    workdir: Path
    app_env: dict[str, str]  # the contents of the env file (.env: compose interpolates `${...}` from it)
    localize: Callable[[str], str]  # compose host names / paths → this machine
    gpu_extra_env: dict[str, str] = field(default_factory=dict)  # test isolation only (key prefix), no credentials
    bot_extra_env: dict[str, str] = field(default_factory=dict)  # test-only knobs of the bot side (API URL...)
    procs: list[Proc] = field(default_factory=list)

    def __post_init__(self):
        self.services = compose_services()
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        self.base_env = {k: os.environ[k] for k in BASE_ENV_KEYS if k in os.environ}
        self.base_env.update(HOME=str(home), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")

    # ---- what compose would run ---------------------------------------------------------------
    def command(self, service: str, replace: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> list[str]:
        """The service's command with `tokengate` → this interpreter; `replace` maps an option to a new value."""
        cmd = list(self.services[service]["command"])
        assert cmd[0] == "tokengate", cmd
        for opt, value in (replace or {}).items():
            cmd[cmd.index(opt) + 1] = value
        return [sys.executable, "-m", "bot.cli", *cmd[1:], *extra]

    def environment(self, service: str) -> dict[str, str]:
        spec = self.services[service]
        env = dict(self.base_env)
        env.update({k: self.localize(interpolate(str(v), self.app_env))
                    for k, v in (spec.get("environment") or {}).items()})
        env.update(self.gpu_extra_env if service.startswith("gpu-worker") else self.bot_extra_env)
        return env

    # ---- processes ----------------------------------------------------------------------------
    def run_once(self, service: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(service), env=self.environment(service), cwd=self.workdir,
                              capture_output=True, text=True, timeout=timeout)

    def start(self, service: str, replace: dict[str, str] | None = None, extra: tuple[str, ...] = (),
              env_update: dict[str, str] | None = None) -> Proc:
        env = {**self.environment(service), **(env_update or {})}
        n = sum(p.name == service for p in self.procs)
        log = self.workdir / f"{service}{f'.{n}' if n else ''}.log"
        with open(log, "wb") as f:
            popen = subprocess.Popen(self.command(service, replace, extra), env=env, cwd=self.workdir, stdout=f,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        proc = Proc(service, popen, log, env, cmd=self.command(service, replace, extra))
        self.procs.append(proc)
        return proc

    def supervise(self, interval: float = 0.5) -> "NativeStack":
        """Do what compose's `restart: unless-stopped` does: a service process that exited by itself (a crash)
        is started again, with its command and environment; `restarts` lists (service, exit code)."""
        import threading
        self.restarts: list[tuple[str, int]] = []

        def loop():
            while not getattr(self, "_stopping", False):
                for proc in list(self.procs):
                    policy = str(self.services.get(proc.name, {}).get("restart", "no"))
                    if proc.killed or proc.replaced_by or proc.alive() or policy in ("no", "False"):
                        continue
                    self.restarts.append((proc.name, proc.popen.returncode))
                    log = self.workdir / f"{proc.name}.restart{len(self.restarts)}.log"
                    with open(log, "wb") as f:
                        popen = subprocess.Popen(proc.cmd, env=proc.env, cwd=self.workdir, stdout=f,
                                                 stderr=subprocess.STDOUT, start_new_session=True)
                    proc.replaced_by = Proc(proc.name, popen, log, proc.env, cmd=proc.cmd)
                    self.procs.append(proc.replaced_by)
                time.sleep(interval)
        threading.Thread(target=loop, name="native-stack-supervisor", daemon=True).start()
        return self

    def wait_for_log(self, proc: Proc, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in proc.output():
                return
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.output()[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(f"{proc.name}: no {text!r} after {timeout} s:\n{proc.output()[-4000:]}")

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} (pid {p.popen.pid}, rc {p.popen.poll()}) =====\n{p.output()[-6000:]}"
                         for p in self.procs)

    def stop(self, proc: Proc, grace: float = 10.0) -> None:
        """SIGTERM to the process group (Celery's warm shutdown), SIGKILL after `grace` seconds."""
        proc.killed = True
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.popen.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.popen.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # A child that left the group (none should) would outlive the test: make sure it did not.
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def kill(self, proc: Proc) -> None:
        """SIGKILL the whole group at once: the host vanished, nothing gets to clean up."""
        while proc.replaced_by is not None:  # it crashed and was restarted: kill what runs now
            proc = proc.replaced_by
        proc.killed = True
        os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(timeout=10)

    def stop_all(self) -> None:
        self._stopping = True
        for proc in reversed(self.procs):
            self.stop(proc)
