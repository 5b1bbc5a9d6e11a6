import os
import socket
from pathlib import Path
import sys
import time

import pytest

from worker import sandbox
from worker.harness.client import RevisionFault, RevisionProcess

from tests.worker.helpers import GOOD, fake_model


def _run(tmp_path, code: str, **kw):
    spec = sandbox.SandboxSpec(scratch=tmp_path / "scratch", read_only=[Path(sys.prefix), Path(sys.base_prefix)], **kw)
    log = tmp_path / "log"
    p = sandbox.spawn([sys.executable, "-I", "-c", code], spec, log_path=log)
    p.stdin.close()
    rc = p.wait(timeout=60)
    return rc, log.read_text()


@pytest.mark.sandbox
def test_environment_is_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_supersecret123")
    monkeypatch.setenv("TOKENGATE_DATABASE_URL", "postgresql://u:p@h/db")
    rc, out = _run(tmp_path, "import os, sys; sys.stderr.write(repr(sorted(os.environ)))")
    assert rc == 0
    assert "GITHUB_TOKEN" not in out and "DATABASE" not in out and "HOME" in out


def test_no_network_when_the_host_can_isolate(tmp_path):
    iso = sandbox.detect_isolation()
    if not iso.network_isolated:
        pytest.skip(f"host cannot isolate the network: {iso.reason}")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    code = (f"import socket,sys\ntry:\n socket.create_connection(('127.0.0.1',{port}),timeout=2)\n"
            " sys.stderr.write('CONNECTED')\nexcept OSError as e:\n sys.stderr.write('REFUSED '+str(e))")
    rc, out = _run(tmp_path, code)
    srv.close()
    assert "REFUSED" in out and "CONNECTED" not in out


@pytest.mark.sandbox
def test_memory_limit(tmp_path):
    rc, out = _run(tmp_path, "b = bytearray(3 << 30)\nb[::4096] = b'x' * len(b[::4096])\nprint('DONE')",
                   memory_limit_bytes=1 << 30)
    assert rc != 0 and "DONE" not in out  # the cgroup's memory.max (OOM kill)


def test_spawn_refuses_a_weaker_sandbox(tmp_path, monkeypatch):
    """The last line of fail-closed: even a caller that skipped the pipeline's check gets no weaker sandbox."""
    import worker.sandbox.process as sp
    from worker.sandbox import probe

    monkeypatch.setattr(sp, "detect_isolation", lambda: probe.Isolation("degraded: none", False, False, "test: no bwrap"))
    marker = tmp_path / "ran"
    with pytest.raises(sandbox.SandboxUnavailable, match="no bwrap"):
        _run(tmp_path, f"open({str(marker)!r}, 'w')")
    assert not marker.exists()


@pytest.mark.sandbox
@pytest.mark.timed  # a deadline
def test_timeout_kills_the_whole_process_group(tmp_path):
    m = fake_model(tmp_path / "m.gguf")
    proc = RevisionProcess("head", GOOD, tmp_path / "w", read_only=[tmp_path])
    proc.start(30)
    pids = sandbox.tree_pids(proc.proc.pid)
    t = time.monotonic()
    with pytest.raises(RevisionFault) as e:
        # A request the driver will not answer quickly: load blocks on a FIFO nobody writes.
        os.mkfifo(tmp_path / "fifo")
        proc.request("load", path=str(tmp_path / "fifo"), device="cpu", max_context=64, backend="auto",
                     phase="load", timeout=1.0)
    assert e.value.kind == "timeout" and time.monotonic() - t < 10
    time.sleep(0.2)
    assert all(not os.path.exists(f"/proc/{p}") or open(f"/proc/{p}/stat").read().split()[2] == "Z" for p in pids)
    proc.close()
    assert m.exists()


def test_home_is_hidden_under_bwrap(tmp_path, monkeypatch):
    if not sandbox.detect_isolation().bwrap:
        pytest.skip("only bubblewrap hides paths")
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / ".config" / "token").write_text("ghp_topsecret")
    code = ("import sys\ntry:\n sys.stderr.write(open(%r).read())\nexcept OSError as e:\n sys.stderr.write('HIDDEN')"
            % str(home / ".config" / "token"))
    rc, out = _run(tmp_path, code, hide=[home])
    assert "HIDDEN" in out and "topsecret" not in out
