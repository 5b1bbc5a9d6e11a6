"""Escapes: remount, umount, new namespaces, setns, chroot, writing the trusted driver or its own checkout."""
from ._honest import causal_mask, decode_step, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)


def on_load():
    import ctypes
    import glob
    import os
    from . import _attacks as a
    T = a.TARGET
    here = os.path.dirname(os.path.abspath(__file__))
    driver = glob.glob("/**/driver/driver.py", recursive=False) or [os.path.realpath(os.sys.argv[0])]
    got = {
        "remount_root_rw": a.syscall_ok("mount", None, b"/", None, ctypes.c_ulong(32 | 4096 | 16384), None),
        "umount_tmp": a.syscall_ok("umount2", b"/tmp", 2),
        "unshare_user": a.syscall_ok("unshare", 0x10000000),
        "unshare_mount": a.syscall_ok("unshare", 0x00020000),
        "setns": a.syscall_ok("setns", os.open("/proc/self/ns/net", os.O_RDONLY), 0),
        "chroot": a.syscall_ok("chroot", b"/tmp"),
        "shell_umount": os.system("umount -l /tmp 2>/dev/null") == 0,
        "write_driver": a.write(driver[0], b"# patched"),
        "write_checkout": a.write(os.path.join(here, "__init__.py"), b"# patched"),
        "write_trusted": a.write(T["trusted_file"], b"# patched"),
        "ptrace_parent": a.syscall_ok("ptrace", 16, os.getppid(), None, None),  # PTRACE_ATTACH
    }
    a.report(got)


# Attack at import time (the harness imports `runtime` in its hello): a failure is the revision's own.
on_load()


def on_load():  # noqa: F811 - the attack already ran
    pass
