"""A seccomp filter for revision code, compiled to classic BPF in Python (bwrap `--seccomp FD`).

Deny-list: the syscalls a sandboxed benchmark never needs and an escape always does (mounts,
namespaces, tracing, kernel keyrings, BPF, module/kexec loading, clock setting...). They fail with
EPERM; a foreign architecture (e.g. x32 or i386 calls on x86_64) kills the process. clone() with
any CLONE_NEW* flag fails too; clone3 returns ENOSYS so libc falls back to the checked clone().
"""
from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16

BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
BPF_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
BPF_RET_K = 0x06

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

DENIED = (
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "ptrace", "process_vm_readv",
    "process_vm_writev", "bpf", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at",
    "perf_event_open", "userfaultfd", "swapon", "swapoff", "reboot", "acct", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "quotactl", "syslog", "vhangup", "open_tree",
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "kcmp", "pidfd_getfd",
    "iopl", "ioperm", "uselib", "lookup_dcookie",
)

# Refused with another errno than EPERM. fallocate(FALLOC_FL_KEEP_SIZE) reserves disk blocks without growing
# the file, so RLIMIT_FSIZE never applies: on the stderr log (a host file) or in a writable host directory it
# would take any amount of the host's disk. EOPNOTSUPP makes glibc's posix_fallocate fall back to writing
# zeros, which the limit caps.
OTHER_ERRNO = {"fallocate": errno.EOPNOTSUPP}

# Syscall numbers (Linux uapi: arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h);
# tests/worker/redteam/test_escape.py checks them against this machine's kernel headers.
SYSCALLS = {
    "x86_64": {
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321, "keyctl": 250,
        "add_key": 248, "request_key": 249, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "open_by_handle_at": 304, "name_to_handle_at": 303,
        "perf_event_open": 298, "userfaultfd": 323, "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163,
        "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "quotactl": 179,
        "syslog": 103, "vhangup": 153, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "kcmp": 312, "pidfd_getfd": 438, "iopl": 172,
        "ioperm": 173, "uselib": 134, "lookup_dcookie": 212, "clone": 56, "clone3": 435, "fallocate": 285,
    },
    "aarch64": {
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280, "keyctl": 219,
        "add_key": 217, "request_key": 218, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "perf_event_open": 241, "userfaultfd": 282, "swapon": 224, "swapoff": 225, "reboot": 142, "acct": 89,
        "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171, "quotactl": 60,
        "syslog": 116, "vhangup": 58, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "kcmp": 272, "pidfd_getfd": 438,
        "lookup_dcookie": 18, "clone": 220, "clone3": 435, "fallocate": 47,
    },
}


class UnsupportedArch(RuntimeError):
    pass


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def build_filter(arch: str | None = None, denied: tuple[str, ...] = DENIED) -> bytes:
    """The compiled program (an array of struct sock_filter) for `arch` (default: this machine's)."""
    arch = arch or platform.machine()
    if arch not in SYSCALLS:
        raise UnsupportedArch(f"no seccomp syscall table for {arch!r} (supported: {', '.join(SYSCALLS)})")
    table = SYSCALLS[arch]
    nrs = sorted({table[n] for n in denied if n in table})
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    prog = [
        _ins(BPF_LD_W_ABS, 0, 0, _OFF_ARCH),
        _ins(BPF_JEQ_K, 1, 0, AUDIT_ARCH[arch]),
        _ins(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        _ins(BPF_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if arch == "x86_64":  # the x32 ABI shares the arch value: refuse it outright
        prog += [_ins(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT), _ins(BPF_RET_K, 0, 0, eperm)]
    # clone3 passes its flags in memory the filter cannot read: ENOSYS makes libc use clone().
    prog += [_ins(BPF_JEQ_K, 0, 1, table["clone3"]), _ins(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)]
    # clone(flags, ...): flags are args[0] on both architectures; any CLONE_NEW* bit is refused.
    prog += [
        _ins(BPF_JEQ_K, 0, 4, table["clone"]),
        _ins(BPF_LD_W_ABS, 0, 0, _OFF_ARG0),  # low 32 bits (little endian) hold every CLONE_NEW* flag
        _ins(BPF_JSET_K, 0, 1, CLONE_NEW_MASK),
        _ins(BPF_RET_K, 0, 0, eperm),
        _ins(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    for nr in nrs:
        prog += [_ins(BPF_JEQ_K, 0, 1, nr), _ins(BPF_RET_K, 0, 0, eperm)]
    for name, err in OTHER_ERRNO.items():
        prog += [_ins(BPF_JEQ_K, 0, 1, table[name]), _ins(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | err)]
    prog.append(_ins(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    return b"".join(prog)
