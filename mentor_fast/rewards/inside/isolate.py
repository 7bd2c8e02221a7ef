"""The program's view of the machine, set up inside its namespaces before the program runs.

The process starts as the first process of fresh mount, PID, network, IPC and UTS namespaces
(`unshare`, see rewards/sandbox.py). Here it builds a root of its own on a tmpfs and pivots into it:

- read-only binds of what an interpreter needs: its installation (sys.base_prefix) and the system
  directories /usr, /bin, /sbin, /lib*, /etc; symlinks where the host has symlinks;
- /dev with null, zero, full, random and urandom; /proc (the namespace's own: it shows the
  program's processes only); /tmp and /dev/shm as small tmpfs mounts of its own;
- nothing else: no checkout, no virtual environment, no home directory, no data directory. The
  package directories that the trainer's interpreter uses (site-packages, dist-packages, the
  virtual environment, the checkout and the working directory: `spec["hide"]`) are covered with
  empty read-only tmpfs mounts wherever they fall inside the binds, so no dataset a package ships
  (HumanEval's tests, the code ladder's generator) is readable from inside.

The old root is detached after the pivot, so no path leads back to it. Then the process gives its
privileges up: host root becomes `spec["uid"]`, a uid and gid of its own that no other sandbox
running beside it has (per-user tables such as RLIMIT_NPROC's process count are not shared); under
an unprivileged user namespace it enters a nested one, which holds no capability over these mounts.
"""

from __future__ import annotations

import ctypes
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_PRIVATE, MS_RELATIME, MNT_DETACH = 1 << 18, 1 << 21, 2
ST_NOATIME, ST_NODIRATIME, ST_RELATIME = 1024, 2048, 4096  # statvfs's f_flag (ST_RELATIME is not MS_RELATIME)
CLONE_NEWUSER = 0x10000000
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203, "ppc64": 203,
              "s390x": 217}  # pivot_root(2) has no libc wrapper
STAGE = "/tmp"  # where the new root is built, in this mount namespace only


class _Mounts:
    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None):
        enc = (lambda s: None if s is None else s.encode())
        if self.libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target}")

    def bind_readonly(self, fd: int, target: str, nodev: bool = True) -> None:
        """Bind what `fd` opens (an O_PATH descriptor) at `target`, read-only. The remount keeps the
        source mount's flags: a user namespace may not clear them."""
        self.mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
        flag = os.statvfs(target).f_flag
        keep = flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | ST_NOATIME | ST_NODIRATIME)
        keep |= MS_RELATIME if flag & ST_RELATIME else 0
        extra = MS_NOSUID | (MS_NODEV if nodev else 0)
        self.mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep | extra)

    def tmpfs(self, target: str, size_mb: float, mode: str, flags: int = MS_NOSUID | MS_NODEV) -> None:
        self.mount("tmpfs", target, "tmpfs", flags, f"size={max(4, int(size_mb * 1024))}k,mode={mode}")


def _makedirs(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)


def _sources(base: str) -> list[tuple[str, int, str]]:
    """(path, O_PATH descriptor, kind) of everything the new root shows, opened before any mount
    covers the paths (the stage hides the host's /tmp, where an interpreter may live)."""
    out = []
    for name in SYSTEM:
        path = "/" + name
        if os.path.islink(path):
            out.append((path, -1, "link"))
        elif os.path.isdir(path):
            out.append((path, os.open(path, os.O_PATH | os.O_DIRECTORY), "dir"))
    if not any(base == p or base.startswith(p + "/") for p, _, kind in out if kind == "dir"):
        out.append((base, os.open(base, os.O_PATH | os.O_DIRECTORY), "dir"))
    for name in DEVICES:
        path = "/dev/" + name
        if os.path.exists(path):
            out.append((path, os.open(path, os.O_PATH), "device"))
    return out


def build_root(spec: dict) -> None:
    """The new root on a tmpfs at STAGE, pivoted into; see the module docstring."""
    m = _Mounts()
    m.mount(None, "/", None, MS_REC | MS_PRIVATE)
    base = os.path.realpath(sys.base_prefix)
    executable = os.path.realpath(sys.executable)
    sources = _sources(base)
    proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY)
    m.tmpfs(STAGE, 1, "755", MS_NOSUID | MS_NODEV)
    for path in ("/tmp", "/dev/shm"):  # before the binds: an interpreter may live under /tmp
        _makedirs(STAGE + path)
        m.tmpfs(STAGE + path, 4 * spec["file_mb"], "1777")
    for path, fd, kind in sources:
        target = STAGE + path
        if kind == "link":
            _makedirs(os.path.dirname(target))
            os.symlink(os.readlink(path), target)
            continue
        if kind == "device":
            _makedirs(os.path.dirname(target))
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o666))
            m.mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
        else:
            _makedirs(target)
            m.bind_readonly(fd, target)
        os.close(fd)
    for link, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                     ("stderr", "/proc/self/fd/2")):
        _makedirs(STAGE + "/dev")
        os.symlink(to, f"{STAGE}/dev/{link}")
    _makedirs(STAGE + "/proc")
    m.bind_readonly(proc, STAGE + "/proc")
    os.close(proc)
    os.chdir(STAGE)
    arch = os.uname().machine
    if arch not in PIVOT_ROOT or m.libc.syscall(PIVOT_ROOT[arch], b".", b".") != 0:
        raise OSError(ctypes.get_errno(), f"pivot_root on {arch}")
    if m.libc.umount2(b".", MNT_DETACH) != 0:  # the old root, stacked under the new one by pivot_root(".", ".")
        raise OSError(ctypes.get_errno(), "umount2 of the old root")
    os.chdir("/")
    for path in spec["hide"]:
        if os.path.isdir(path):
            m.tmpfs(path, 0, "555", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    m.mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.mkdir(spec["workdir"], 0o1777)
    os.chdir(spec["workdir"])
    if executable.startswith(base + "/"):
        sys.executable = executable  # the virtual environment's link to it is not in this root
    drop_privileges(m, spec)


def drop_privileges(m: _Mounts, spec: dict) -> None:
    if os.getuid() == 0 and not spec["in_userns"]:
        uid = spec["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # and RLIMIT_NPROC binds: it exempts root only
    elif m.libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
