"""Attacks run directly in the sandbox a revision gets: each must be blocked, and nothing may leak.

On a host that cannot build the full sandbox these skip saying so, and FAIL under TOKENGATE_REQUIRE_SANDBOX=1
(`.ci/run`; tests/conftest.py): they never pass there.
"""
import ctypes
import errno
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from worker import sandbox
from worker.sandbox import seccomp

from .conftest import assert_postgres_untouched, run_inside

pytestmark = pytest.mark.sandbox  # never vacuous: skipped where the sandbox is missing, FAILED where it is required


def test_least_privilege_inside(tmp_path):
    rc, out, facts = run_inside(tmp_path, textwrap.dedent("""
        import os, sys
        st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
        seen = [p for p in ('/run', '/var/run', '/etc/shadow', '/root/.ssh', '/home', '/sys/fs/cgroup',
                            '/var/lib/postgresql', '/var/run/postgresql') if os.path.exists(p)]
        sys.stderr.write(repr((os.getuid(), os.getgid(), st['CapEff'].strip(), st['CapBnd'].strip(),
                               st['NoNewPrivs'].strip(), st['Seccomp'].strip(), seen, sorted(os.listdir('/dev')))))
    """))
    assert rc == 0, out
    uid, gid, capeff, capbnd, nnp, mode, seen, dev = eval(out)
    assert (uid, gid, capeff, capbnd, nnp, mode) == (65534, 65534, "0000000000000000", "0000000000000000", "1", "2")
    assert seen == []
    assert set(dev) <= {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd", "stdin",
                        "stdout", "stderr", "core"}
    assert facts["limits"]["pids_max"] and facts["limits"]["freeze"] and facts["limits"]["kill"]


def test_host_uid_is_unprivileged_when_the_binds_allow_it(tmp_path):
    """Where every bound path is world-readable the sandbox runs as host uid 65534, not as root."""
    p = sandbox.spawn(["/usr/bin/sleep", "5"], sandbox.SandboxSpec(), log_path=tmp_path / "log")
    try:
        time.sleep(0.5)
        uids = {psutil.Process(q).uids().real for q in p.cgroup.pids()}
        assert p.isolation["host_uid"] == 65534 and uids == {65534}
    finally:
        sandbox.kill_tree(p)
        p.wait()
        p.cgroup.remove()


def test_secrets_and_settings_are_not_visible(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_supersecret123")
    monkeypatch.setenv("TOKENGATE_DATABASE_URL", "postgresql://u:p@h/db")
    secrets_dir = tmp_path / "run" / "secrets"
    secrets_dir.mkdir(parents=True)
    (secrets_dir / "github_app_key").write_text("-----BEGIN KEY----- topsecret")
    (tmp_path / ".env").write_text("TOKENGATE_WEBHOOK_SECRET=whsec_topsecret")
    wt = tmp_path / "worktree"
    wt.mkdir()
    (wt / "ok.txt").write_text("visible")
    code = textwrap.dedent(f"""
        import os, sys
        def r(p):
            try: return open(p).read()
            except OSError as e: return 'BLOCKED'
        sys.stderr.write(repr([r({str(secrets_dir / 'github_app_key')!r}), r({str(tmp_path / '.env')!r}),
                               r('/etc/shadow'), r('/proc/%d/environ' % os.getppid()), r('/proc/1/environ'),
                               r({f'/proc/{os.getpid()}/environ'!r}), r({str(wt / 'ok.txt')!r}), dict(os.environ)]))
    """)
    rc, out, _ = run_inside(tmp_path, code, read_only=[wt])
    assert rc == 0, out
    got = eval(out)
    assert got[:3] == ["BLOCKED"] * 3
    assert all("ghs_" not in x and "postgresql" not in x for x in got[3:6])
    assert got[6] == "visible"
    assert not any(k in got[7] for k in ("GITHUB_TOKEN", "TOKENGATE_DATABASE_URL"))


def test_no_network_tcp_unix_or_abstract(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.1)
    port = srv.getsockname()[1]
    upath = str(tmp_path / "svc.sock")
    usrv = socket.socket(socket.AF_UNIX)
    usrv.bind(upath)
    usrv.listen(1)
    usrv.settimeout(0.1)
    abstract = b"\0tokengate-test-" + uuid.uuid4().hex.encode()
    asrv = socket.socket(socket.AF_UNIX)
    asrv.bind(abstract)
    asrv.listen(1)
    asrv.settimeout(0.1)
    code = textwrap.dedent(f"""
        import socket, sys
        res = []
        for fam, addr in ((socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_UNIX, {upath!r}),
                          (socket.AF_UNIX, {abstract!r})):
            s = socket.socket(fam)
            s.settimeout(2)
            try:
                s.connect(addr); res.append('CONNECTED')
            except OSError as e:
                res.append('BLOCKED')
        sys.stderr.write(repr(res))
    """)
    rc, out, _ = run_inside(tmp_path, code)
    assert eval(out) == ["BLOCKED"] * 3
    for s in (srv, usrv, asrv):
        with pytest.raises(socket.timeout):
            s.accept()  # nothing ever reached the host side
        s.close()


@pytest.mark.services("Redis")  # apart from PostgreSQL: the GPU box runs Redis (the queue) and no PostgreSQL
def test_redis_unreachable(tmp_path):
    import redis

    marker = "tg_redteam_" + uuid.uuid4().hex[:10]
    code = textwrap.dedent(f"""
        import sys
        try:
            import redis; redis.Redis(host='127.0.0.1', socket_connect_timeout=2).set({marker!r}, 'x'); out = 'REDIS'
        except Exception: out = 'blocked'
        sys.stderr.write(repr(out))
    """)
    rc, out, _ = run_inside(tmp_path, code)
    assert eval(out) == "blocked"
    assert redis.Redis(host="127.0.0.1").get(marker) is None


@pytest.mark.services("PostgreSQL")
def test_postgres_unreachable(tmp_path):
    marker = "tg_redteam_" + uuid.uuid4().hex[:10]
    code = textwrap.dedent(f"""
        import sys
        out = []
        for host in ('127.0.0.1', '/var/run/postgresql'):
            try:
                import psycopg2
                c = psycopg2.connect(host=host, user='postgres', dbname='postgres', connect_timeout=2,
                                     application_name={marker!r})
                c.autocommit = True; c.cursor().execute('CREATE TABLE {marker} (x int)'); out.append('PG')
            except Exception: out.append('blocked')
        sys.stderr.write(repr(out))
    """)
    rc, out, _ = run_inside(tmp_path, code)
    assert eval(out) == ["blocked"] * 2
    assert_postgres_untouched(marker)


NR = seccomp.SYSCALLS.get(os.uname().machine, {})


def test_seccomp_refuses_escapes_even_for_root(tmp_path):
    """The filter alone, loaded by a ROOT process in a private mount namespace: without it every one
    of these calls would succeed; with it each fails with EPERM, while ordinary work goes on."""
    prog = tmp_path / "filter.bin"
    prog.write_bytes(seccomp.build_filter())
    code = textwrap.dedent(f"""
        import ctypes, errno, os, struct, sys, threading
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unshare(0x00020000) == 0  # private mounts first, while still allowed
        libc.mount(b'none', b'/', None, 0x40000 | 0x4000, None)  # MS_REC|MS_PRIVATE
        os.makedirs({str(tmp_path / 'mnt')!r}, exist_ok=True)
        data = open({str(prog)!r}, 'rb').read()
        buf = ctypes.create_string_buffer(data)
        class fprog(ctypes.Structure):
            _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]
        fp = fprog(len(data) // 8, ctypes.cast(buf, ctypes.c_void_p))
        assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
        assert libc.prctl(22, 2, ctypes.byref(fp), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
        def call(name, *a):
            r = getattr(libc, name)(*a)
            return 'ok' if r == 0 else errno.errorcode.get(ctypes.get_errno(), '?')
        sc = libc.syscall
        res = {{
            'mount': call('mount', b'none', {str(tmp_path / 'mnt').encode()!r}, b'tmpfs', 0, None),
            'umount2': call('umount2', b'/proc', 2),
            'unshare_ns': call('unshare', 0x00020000),
            'unshare_user': call('unshare', 0x10000000),
            'setns': call('setns', os.open('/proc/self/ns/uts', os.O_RDONLY), 0),
            'chroot': call('chroot', b'/'),
            'ptrace': call('ptrace', 0, 0, None, None),
            'clone_newuser': 'ok' if sc({NR.get('clone')}, 0x10000000 | 17, 0, 0, 0, 0) >= 0 else errno.errorcode[ctypes.get_errno()],
            'bpf': 'ok' if sc({NR.get('bpf')}, 0, 0, 0) >= 0 else errno.errorcode[ctypes.get_errno()],
            'keyctl': 'ok' if sc({NR.get('keyctl')}, 0, 0, 0) >= 0 else errno.errorcode[ctypes.get_errno()],
            'pivot_root': 'ok' if sc({NR.get('pivot_root')}, b'/', b'/') >= 0 else errno.errorcode[ctypes.get_errno()],
        }}
        t = threading.Thread(target=lambda: None); t.start(); t.join()
        res['fork'] = 'ok' if os.waitpid(os.fork() or os._exit(0), 0) else '?'
        sys.stderr.write(repr(res))
    """)
    p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    res = eval(p.stderr.strip().splitlines()[-1])
    assert res.pop("fork") == "ok"
    assert res == {k: "EPERM" for k in res}, res


def test_seccomp_tables_match_this_kernels_headers():
    hdr = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    if not hdr.exists():
        pytest.skip("kernel headers (linux-libc-dev) not installed")
    table = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)", hdr.read_text())}
    assert {k: table.get(k) for k in seccomp.SYSCALLS["x86_64"]} == seccomp.SYSCALLS["x86_64"]
    generic = Path("/usr/include/asm-generic/unistd.h")
    table = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)", generic.read_text())}
    assert {k: table.get(k) for k in seccomp.SYSCALLS["aarch64"]} == seccomp.SYSCALLS["aarch64"]
    with pytest.raises(seccomp.UnsupportedArch):
        seccomp.build_filter("riscv64")


def test_fork_bomb_stops_at_pids_max_and_leaves_nothing(tmp_path):
    code = textwrap.dedent("""
        import os, sys, time
        n = 0
        while n < 10000:
            try:
                if os.fork() == 0:
                    os.setsid(); time.sleep(300); os._exit(0)
            except OSError as e:
                sys.stderr.write('STOPPED %d %s' % (n, e)); sys.stderr.flush(); break
            n += 1
        time.sleep(300)
    """)
    t0 = time.monotonic()
    rc, out, facts = run_inside(tmp_path, code, pids_max=40, timeout=4)
    n = int(re.search(r"STOPPED (\d+)", out).group(1))
    assert n < 40 and facts["pids_hits"] > 0
    assert time.monotonic() - t0 < 30
    assert not [p for p in psutil.process_iter(["cmdline"]) if "STOPPED %d" in " ".join(p.info["cmdline"] or [])]


def test_tmpfs_counts_against_the_memory_limit(tmp_path):
    code = "f = open('/tmp/fill', 'wb')\nfor _ in range(400): f.write(b'x' * (1 << 20)); f.flush()\nprint('DONE', flush=True)"
    rc, out, facts = run_inside(tmp_path, code, memory_limit_bytes=128 << 20, tmp_bytes=1 << 30)
    assert rc != 0 and "DONE" not in out and facts["oom_kills"] > 0


def test_signals_reach_no_host_process_and_dev_shm_counts_against_memory(tmp_path):
    """No hole found: SIGSTOP to the worker's pid, to another host process and to -1 reaches nothing (own PID
    namespace: ESRCH), and /dev (a tmpfs bwrap makes without a size cap) is charged to memory.max like /tmp."""
    victim = subprocess.Popen(["sleep", "60"])
    code = textwrap.dedent(f"""
        import os, signal, sys
        r = []
        for pid in ({os.getpid()}, {victim.pid}, -1):
            try: os.kill(pid, signal.SIGSTOP); r.append('SIGNALLED')
            except OSError as e: r.append(e.errno)
        sys.stderr.write(repr(r) + chr(10)); sys.stderr.flush()
        f = open('/dev/shm/fill', 'wb')
        for _ in range(400): f.write(b'x' * (1 << 20)); f.flush()
        sys.stderr.write('DONE')
    """)
    try:
        rc, out, facts = run_inside(tmp_path, code, memory_limit_bytes=128 << 20)
        assert psutil.Process(victim.pid).status() != psutil.STATUS_STOPPED
    finally:
        victim.kill()
        victim.wait()
    assert eval(out.splitlines()[0]) == [errno.ESRCH] * 3
    assert rc != 0 and "DONE" not in out and facts["oom_kills"] > 0


def test_scratch_is_size_capped(tmp_path):
    code = ("import os, sys\nn = 0\ntry:\n f = open(os.environ['HOME'] + '/fill', 'wb')\n while n < 200:\n"
            "  f.write(b'x' * (1 << 20)); f.flush(); n += 1\nexcept OSError as e:\n sys.stderr.write('STOP %d %s' % (n, e))")
    rc, out, _ = run_inside(tmp_path, code, scratch_bytes=32 << 20)
    assert "STOP" in out and "No space left" in out and int(out.split()[1]) <= 32
    assert not list(tmp_path.rglob("fill"))  # scratch never lived on the host


def test_fallocate_cannot_reserve_host_disk_past_the_file_size_limit(tmp_path):
    """fallocate(FALLOC_FL_KEEP_SIZE) skips RLIMIT_FSIZE (the file's size never grows): on the stderr log (a
    host file) and in a writable host dir (the compile cache) it reserved 2 GiB of real disk under a 1 GiB cap.
    Refused now (EOPNOTSUPP, so glibc's posix_fallocate falls back to writes, which the limit does cap)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    code = textwrap.dedent(f"""
        import ctypes, os, sys
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        fd = os.open({str(cache / 'big')!r}, os.O_CREAT | os.O_WRONLY, 0o644)
        res = [libc.fallocate(f, 1, 0, 2 << 30) == 0 or ctypes.get_errno() for f in (2, fd)]
        with open('/tmp/small', 'wb') as f:
            os.posix_fallocate(f.fileno(), 0, 1 << 20)  # ordinary use still works (glibc writes instead)
            res.append(os.fstat(f.fileno()).st_size)
        sys.stderr.write(repr(res))
    """)
    rc, out, _ = run_inside(tmp_path, code, writable=[cache])
    assert rc == 0, out
    assert eval(out.strip().splitlines()[-1]) == [errno.EOPNOTSUPP, errno.EOPNOTSUPP, 1 << 20]
    held = sum(f.stat().st_blocks * 512 for f in tmp_path.rglob("*") if f.is_file())
    assert held < (64 << 20), held  # no host disk was reserved


class _Listing:
    """A finished directory listing that still quacks like os.scandir's iterator."""

    def __init__(self, entries):
        self._it = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def close(self):
        pass


def test_handing_over_the_compile_cache_follows_no_link_swapped_in_mid_walk(tmp_path, monkeypatch):
    """The worker (root) chowns a revision's compile cache to the sandbox uid at each spawn while another process
    of the same SHA (the evaluation's first head, beside each fresh pair's) may be running in it. That process
    swaps a directory the walk has just listed for a symlink to a host directory: a path-based lchown of
    `dir/name` follows the swapped-in parent and chowns a host file (e.g. /etc/shadow) to uid 65534. Simulated
    deterministically: the swap happens right after the walk lists the directory."""
    if os.getuid() != 0:
        pytest.skip("the hand-over chowns only when the worker is root")
    from worker.sandbox import process
    cache, host = tmp_path / "cache", tmp_path / "host"
    (cache / "sub").mkdir(parents=True)
    host.mkdir()
    (cache / "sub" / "shadow").write_text("planted")
    (host / "shadow").write_text("root's")
    os.chown(cache / "sub" / "shadow", 1234, 1234)  # not yet the sandbox uid: it gets chowned
    real_scandir = os.scandir

    def racing_scandir(arg=None):
        entries = list(real_scandir(arg) if arg is not None else real_scandir())
        listed = os.readlink(f"/proc/self/fd/{arg}") if isinstance(arg, int) else os.fspath(arg or ".")
        if os.path.realpath(listed) == str(cache / "sub"):
            os.rename(cache / "sub", cache / "sub.moved")
            os.symlink(host, cache / "sub")  # the revision's swap, between the listing and the chown
        return _Listing(entries)
    monkeypatch.setattr(os, "scandir", racing_scandir)
    process._hand_over([cache], 65534)
    monkeypatch.undo()
    assert os.lstat(host / "shadow").st_uid == 0  # the host file kept its owner
    assert os.lstat(cache / "sub.moved" / "shadow").st_uid == 65534  # the cache's own file was handed over


def test_cpu_of_exited_threads_and_children_is_counted(tmp_path):
    code = textwrap.dedent("""
        import os, threading, time
        def burn():
            end = time.process_time() + 0.4
            while time.process_time() < end: pass
        t = threading.Thread(target=burn); t.start(); t.join()
        if os.fork() == 0:
            burn(); os._exit(0)
        os.wait()
    """)
    rc, out, facts = run_inside(tmp_path, code)
    assert rc == 0, out
    assert facts["cpu_ns"] >= 0.75e9  # both the exited thread's and the reaped child's 0.4 s


def test_freeze_stops_every_thread_and_kill_gets_setsid_daemons(tmp_path):
    code = textwrap.dedent("""
        import os, threading, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while True: pass   # a double-forked, setsid'd daemon burning CPU
            os._exit(0)
        threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()
        time.sleep(300)
    """)
    spec = sandbox.SandboxSpec(read_only=[Path(sys.prefix)])
    p = sandbox.spawn([sys.executable, "-I", "-c", code], spec, log_path=tmp_path / "log")
    cg = p.cgroup
    try:
        time.sleep(1.0)
        cg.freeze(True)
        a = cg.cpu_usage_ns()
        time.sleep(0.5)
        assert cg.cpu_usage_ns() - a < 5e6  # frozen: no thread of it ran
        cg.freeze(False)
        a = cg.cpu_usage_ns()
        time.sleep(0.5)
        assert cg.cpu_usage_ns() - a > 2e8
        procs = [psutil.Process(x) for x in cg.pids()]
        assert len(procs) >= 3
    finally:
        sandbox.kill_tree(p)
        p.wait(timeout=10)
    time.sleep(0.2)

    def alive(q):
        try:
            return q.is_running() and q.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False
    assert cg.pids() == [] and not [q for q in procs if alive(q)]
    cg.remove()
