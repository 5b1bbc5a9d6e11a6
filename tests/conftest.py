"""Suite-wide test setup.

Test data lives in the repository (`tests/paths.py`); nothing outside the checkout is read. Tests marked
`services` need the PostgreSQL and Redis on 127.0.0.1 (`.ci/run` starts them) and skip, saying which one
and how to start it, when they are down. Tests marked `sandbox` need the full sandbox (bubblewrap, user namespaces,
cgroup v2): on a host that cannot build it they skip saying why, and FAIL under TOKENGATE_REQUIRE_SANDBOX=1 (`.ci/run`
sets it: where the sandbox is required, a missing one must not pass as skipped security tests).
"""
import fcntl
import os
import socket
import tempfile
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import pytest
import torch

# On the 2-core CI box a second torch thread only spins; one thread is faster and repeatable.
torch.set_num_threads(1)

SERVICES = {
    "PostgreSQL": (5432, "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"),
    "Redis": (6379, 'redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ""'),
}


@lru_cache(maxsize=None)
def service_down(name: str) -> str | None:
    """A one-line reason when the named service does not accept connections on 127.0.0.1, else None."""
    port, how = SERVICES[name]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as exc:
        return f"{name} on 127.0.0.1:{port} is not reachable ({exc.strerror or exc}); start it with `{how}` or run .ci/run"
    return None


@lru_cache(maxsize=None)
def sandbox_missing() -> str | None:
    """Why this host cannot build the full sandbox (worker/sandbox/probe.py), else None."""
    from worker.sandbox import detect_isolation
    iso = detect_isolation()
    return None if iso.full else iso.reason


def pytest_runtest_setup(item):
    if (marker := item.get_closest_marker("services")) is not None:
        for name in marker.args or SERVICES:  # @pytest.mark.services("Redis"): that one alone
            if reason := service_down(name):
                pytest.skip(reason)
    if item.get_closest_marker("sandbox") is not None and (why := sandbox_missing()):
        reason = (f"needs the full sandbox, which this host cannot build ({why}); install bubblewrap (Debian package "
                  "bubblewrap) on a host with user namespaces and cgroup v2, or run .ci/run")
        if os.environ.get("TOKENGATE_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"{reason}. TOKENGATE_REQUIRE_SANDBOX=1: failed, not skipped", pytrace=False)
        pytest.skip(reason)


def pytest_collection_modifyitems(session, config, items):
    """tests/bot/history runs last: its package-scoped Celery worker (the tree-speed fake under its own task
    name) left the shared app in a state that made later bot tests' workers time out when it ran first.
    Tests that evaluate (the `cache` fixture sets up the pipeline's cache) are `timed`. Within each of the two
    parts the timed tests come after the others: a timed test waits for the other worker's test in progress to
    end, and runs of timed tests back to back wait once instead of at every one of them."""
    for item in items:
        if "cache" in item.fixturenames:
            item.add_marker("timed")
    items.sort(key=lambda item: ("tests/bot/history/" in item.nodeid, item.get_closest_marker("timed") is not None))


# -- timed tests run alone --------------------------------------------------------------------------------
# The test command runs the suite on two xdist workers. A test whose outcome rests on measured speed or on
# deadlines (A/A noise against a calibrated floor, request timeouts) must not share the cores with another
# test: calibration pairs taken beside one load and evaluation pairs beside another are exactly the drift
# the product's own bound does not cover. So a `timed` test holds the room alone and the others share it.
# A turnstile in front keeps a waiting timed test from being starved by the untimed ones going in and out.


def _lock_dir(config) -> Path | None:
    # The run's id from xdist's own handshake, not the environment: a pytest started inside a test (the
    # mutation check, tests/test_timed_alone.py) inherits PYTEST_XDIST_* and would wait on its parent's lock.
    run = getattr(config, "workerinput", {}).get("testrunuid")  # one id for all workers of a run
    if not run:
        return None  # one process: every test runs alone already
    folder = Path(tempfile.gettempdir()) / f"tokengate-pytest-{run}"
    folder.mkdir(exist_ok=True)
    return folder


@contextmanager
def _room(config, alone: bool):
    folder = _lock_dir(config)
    if folder is None:
        yield
        return
    with open(folder / "timed.turnstile", "a") as turnstile, open(folder / "timed.room", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with _room(item.config, alone=item.get_closest_marker("timed") is not None):
        yield


@pytest.fixture(autouse=True)
def _revisions_are_marked(request, monkeypatch):
    """A test that starts a revision process (the harness's sandboxed driver) must be `timed` (under xdist it would
    be timed beside another test) and, where it asks for the full sandbox, `sandbox` (on a machine without one it
    would fail instead of skipping, saying why). Both rules would otherwise rest on remembering to mark it."""
    from worker.harness.client import RevisionProcess

    started = []
    real = RevisionProcess.start

    def start(self, *a, **k):
        started.append((self.role, self.allow_degraded))
        return real(self, *a, **k)

    monkeypatch.setattr(RevisionProcess, "start", start)
    yield
    if started and request.node.get_closest_marker("timed") is None:
        pytest.fail(f"this test started revision processes ({', '.join(r for r, _ in started)}) but is not marked "
                    "@pytest.mark.timed: under xdist it would be timed beside another test", pytrace=False)
    sandboxed = [role for role, degraded in started if not degraded]
    if sandboxed and request.node.get_closest_marker("sandbox") is None:
        pytest.fail(f"this test started revision processes in the full sandbox ({', '.join(sandboxed)}) but is not "
                    "marked @pytest.mark.sandbox: on a machine without bubblewrap it would fail, not skip",
                    pytrace=False)
