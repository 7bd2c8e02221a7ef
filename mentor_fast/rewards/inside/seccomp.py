"""A seccomp filter for the program's process: the system calls whose state is shared across namespaces.

Sandbox side (runs in the program's process before the program; standard library only).

Sandboxes that run side by side share the kernel's view of the read-only files they all show, and
a few per-user or per-session tables, whatever their namespaces. Each of these would let one
program signal another (or itself in a later run), so the program's process gets none of them:

- file locks (`flock`, and `fcntl` F_SETLK/F_SETLKW and the open-file-description variants): a lock
  on a read-only bind of /usr is visible to every other process that opens the same file, and in
  /proc/locks. Locks succeed and do nothing: a program's own locking (sqlite on a file in /tmp)
  runs as if uncontended, and no lock is ever held.
- file leases and directory notifications (`fcntl` F_SETLEASE, F_NOTIFY), inotify and fanotify:
  watching /usr tells one process when another opens a file there. They fail with EPERM.
- kernel keyrings (`add_key`, `request_key`, `keyctl`): the user keyring is shared by every
  process of a uid, and the session keyring is inherited from the trainer. EPERM.
- io_uring (a second way into the kernel that this filter would not see), perf_event_open
  (machine-wide counters), syslog (the kernel's log, which a crash of one program writes to where
  dmesg_restrict is off) and bpf: EPERM.

Per-user accounting (RLIMIT_NPROC, pending signals, pipe buffers, message queues) is closed apart:
each sandbox runs under a uid of its own (isolate.py). Syscalls of another ABI (x32, i386 on
x86_64) are refused outright, since their numbers differ.
"""

from __future__ import annotations

import ctypes
import os

EPERM, ENOSYS = 1, 38
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_NR, _ARCH, _ARG1 = 0, 4, 24  # offsets in struct seccomp_data (the low word of args[1], little-endian)
F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_NOTIFY = 6, 7, 37, 38, 1024, 1026
PR_SET_NO_NEW_PRIVS, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_SPEC_ALLOW = 38, 1, 4

# arch: (AUDIT_ARCH_*, {syscall: number}, seccomp's own number); inotify_init is only on x86_64
_ARCHES = {
    "x86_64": (0xC000003E, {"flock": 73, "fcntl": 72, "inotify_init": 253, "inotify_init1": 294,
                            "fanotify_init": 300, "add_key": 248, "request_key": 249, "keyctl": 250,
                            "perf_event_open": 298, "syslog": 103, "bpf": 321, "io_uring_setup": 425,
                            "io_uring_enter": 426, "io_uring_register": 427}, 317),
    "aarch64": (0xC00000B7, {"flock": 32, "fcntl": 25, "inotify_init1": 26, "fanotify_init": 262,
                             "add_key": 217, "request_key": 218, "keyctl": 219, "perf_event_open": 241,
                             "syslog": 116, "bpf": 280, "io_uring_setup": 425, "io_uring_enter": 426,
                             "io_uring_register": 427}, 277),
}
_X32_BIT = 0x40000000


class _Insn(ctypes.Structure):
    _fields_ = (("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint))


class _Prog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn)))


def program(arch: str) -> list[tuple[int, int, int, int]]:
    """The filter for `arch`, as (code, jt, jf, k) instructions."""
    audit, nr, _ = _ARCHES[arch]
    deny = (_RET, 0, 0, _RET_ERRNO | EPERM)
    out = [(_LD_ABS, 0, 0, _ARCH), (_JEQ, 1, 0, audit), (_RET, 0, 0, _RET_ERRNO | ENOSYS), (_LD_ABS, 0, 0, _NR)]
    if arch == "x86_64":
        out += [(_JGE, 0, 1, _X32_BIT), (_RET, 0, 0, _RET_ERRNO | ENOSYS)]
    out += [(_JEQ, 0, 1, nr["flock"]), (_RET, 0, 0, _RET_ERRNO | 0)]  # errno 0: the call returns 0
    for name in sorted(set(nr) - {"flock", "fcntl"}):
        out += [(_JEQ, 0, 1, nr[name]), deny]
    fcntl = [(_LD_ABS, 0, 0, _ARG1)]
    for cmd in (F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW):
        fcntl += [(_JEQ, 0, 1, cmd), (_RET, 0, 0, _RET_ERRNO | 0)]
    fcntl += [(_JEQ, 1, 0, F_SETLEASE), (_JEQ, 0, 1, F_NOTIFY), deny]
    out += [(_JEQ, 0, len(fcntl), nr["fcntl"]), *fcntl]  # not fcntl: over the block, to ALLOW
    out.append((_RET, 0, 0, _RET_ALLOW))
    return out


def install() -> None:
    """Load the filter into this process (and everything it starts). Raises OSError where it cannot."""
    arch = os.uname().machine
    if arch not in _ARCHES:
        raise OSError(ENOSYS, f"no seccomp filter for {arch}")
    insns = program(arch)
    code = (_Insn * len(insns))(*(_Insn(*i) for i in insns))
    prog = _Prog(len(insns), ctypes.cast(code, ctypes.POINTER(_Insn)))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    # SPEC_ALLOW: without it the kernel also turns on speculative-store-bypass mitigation for the
    # process, which slowed the interpreter's start by a third here; the process holds nothing of
    # anyone else's for that mitigation to protect.
    if libc.syscall(_ARCHES[arch][2], SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_SPEC_ALLOW, ctypes.byref(prog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")
