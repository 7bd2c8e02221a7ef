"""Running a program a model wrote: a fresh interpreter in namespaces of its own, on one node, no service.

Isolation (`unshare` from util-linux, detected at start; `Isolation.NONE` only when asked for):
- PID, network, mount, IPC and UTS namespaces. The program sees no process of the host (it cannot
  signal or trace the trainer or the checker), and no network: the namespace's loopback is down,
  so even 127.0.0.1 is unreachable. When the namespace's first process ends, the kernel kills
  every process in it, so nothing the program started (a setsid daemon included) outlives the call.
- Filesystem (inside/isolate.py): a root of its own that shows the interpreter's installation and the
  system directories read-only, and nothing else: no checkout, no virtual environment, no
  site-packages (so no dataset a package ships), no home. /tmp and /dev/shm are fresh tmpfs
  mounts of the namespace; the program runs in WORKDIR there.
- Privileges: after the mounts the process gives its privileges up: as host root it becomes a
  uid/gid drawn at random for this program alone (from 2**20 up: no account's, and no other
  sandbox's beside it, so per-user tables such as RLIMIT_NPROC's count are its own); under an
  unprivileged user namespace it enters a nested one. Either way it holds no capability over the
  mounts, and RLIMIT_NPROC counts against a uid that is not root's.
- System calls (inside/seccomp.py): those whose state crosses namespaces (file locks on the files every
  sandbox shows, inotify, leases, keyrings, io_uring) do nothing or fail, so programs running side
  by side cannot signal each other through them.
- Environment: empty. Limits (rlimits): address space, CPU seconds, file size, processes, open
  files. Output: each stream is read up to a cap; past it the program is killed (judge.py).
- Timeout: wall clock; the whole namespace is killed (SIGKILL) when it runs out (judge.py).

The process holds its stdout, its stderr and the two ends of its channel to the checker, and
nothing else: the checker, the tests and the verdict live in another process (inside/checker.py).
Its code (RUNNER_MODULES of inside/) arrives compiled on stdin, followed by the program's text.
"""

from __future__ import annotations

import glob
import json
import marshal
import os
import secrets
import select
import shutil
import site
import socket
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from mentor_fast.compat import StrEnum
from mentor_fast.rewards import inside

WORKDIR = "/tmp/work"  # inside the namespace, on its own tmpfs
_UIDS, _UIDS_SPAN = 1 << 20, (1 << 31) - (1 << 20)  # a sandbox's uid as host root: above any account's
MARKER = "mentor-fast-sandbox"  # in every sandboxed program's command line (what a leak check looks for)


class Isolation(StrEnum):
    NAMESPACES = "namespaces"
    NONE = "none"


class SandboxError(RuntimeError):
    """No namespace isolation is possible here (and `sandbox=none` was not asked for)."""


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 1024  # RLIMIT_AS
    cpu_s: int = 30  # RLIMIT_CPU (the wall-clock timeout is the tighter bound in practice)
    file_mb: int = 16  # RLIMIT_FSIZE, and the size of each tmpfs
    processes: int = 64  # RLIMIT_NPROC
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 64 * 1024  # per stream


# Loads modules from a marshalled list of (name, code) on stdin as mentor_fast.rewards.inside.<name>
# (the sandbox may not see the checkout, and compiling them at every start would cost milliseconds).
LOADER = r'''
import marshal, sys
def _load(blob):
    for pkg in ("mentor_fast", "mentor_fast.rewards", "mentor_fast.rewards.inside"):
        sys.modules[pkg] = module = type(sys)(pkg)
        module.__path__ = []
    for name, code in marshal.loads(blob):
        module = type(sys)("mentor_fast.rewards.inside." + name)
        sys.modules[module.__name__] = module
        setattr(sys.modules["mentor_fast.rewards.inside"], name, module)
        exec(code, module.__dict__)
_load(sys.stdin.buffer.read(int.from_bytes(sys.stdin.buffer.read(8), "little")))
'''
# The sandbox's stdin is a socket: the channel's two descriptors come first, with one byte, so that
# only the namespace's first process holds them (not `unshare`, which waits outside), and a program
# that closes its channel is seen doing so.
BOOT = r'''
import _socket, sys
_stdin = _socket.socket(fileno=0)
_, _rights, _, _ = _stdin.recvmsg(1, _socket.CMSG_SPACE(8))
_stdin.detach()
_fds = [int.from_bytes(d[i:i + 4], sys.byteorder, signed=True) for _, _, d in _rights for i in range(0, len(d) - 3, 4)]
''' + LOADER + "from mentor_fast.rewards.inside import runner\nrunner.main(sys.argv[1], _fds)\n"


RUNNER_MODULES = ("wire", "decoder", "isolate", "seccomp", "runner")  # what the program's process loads


@cache
def code_blob(names: tuple[str, ...]) -> bytes:
    """The compiled modules `names` of the inside package, length-prefixed, for LOADER."""
    here = Path(inside.__file__).resolve().parent
    codes = [(n, compile((here / f"{n}.py").read_text(), str(here / f"{n}.py"), "exec")) for n in names]
    blob = marshal.dumps(codes)
    return len(blob).to_bytes(8, "little") + blob


@cache
def hidden_paths() -> tuple[str, ...]:
    """Where this interpreter finds packages and data, covered inside the sandbox wherever they fall
    inside what it shows (inside/isolate.py): site- and dist-packages, the virtual environment, the checkout,
    the working directory. Never a directory that holds the interpreter or the system's."""
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    keep = [os.path.realpath(p) for p in (base["stdlib"], base["platstdlib"], sys.base_prefix)]
    keep += [f"/{d}" for d in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc", "tmp")]
    found = [*site.getsitepackages(), site.getusersitepackages(), base["purelib"], base["platlib"], sys.prefix,
             str(Path(__file__).resolve().parents[2]), os.getcwd(), *(p or os.getcwd() for p in sys.path),
             *glob.glob("/usr/lib/python3*/dist-packages"), *glob.glob("/usr/local/lib/python3*/*-packages"),
             *glob.glob("/usr/lib/python3*/site-packages")]
    out = set()
    for p in map(os.path.realpath, found):
        protected = any(k == p or k.startswith(p.rstrip("/") + "/") for k in keep)
        stdlib = any(p.startswith(k + "/") for k in keep[:2]) and "-packages" not in p
        if os.path.isdir(p) and not protected and not stdlib:
            out.add(p)
    return tuple(sorted(out))


@cache
def detect() -> tuple[Isolation, list[str], str]:
    """What this machine allows: (isolation, launcher prefix, why). Tried once per process."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return Isolation.NONE, [], "no `unshare` (util-linux) on PATH"
    base = [unshare, "--mount", "--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts", "--mount-proc"]
    tries = [(base, False)] if os.getuid() == 0 else []
    tries.append(([unshare, "--user", "--map-root-user", *base[1:]], True))
    why = ""
    for prefix, userns in tries:
        ok, why = probe(prefix, userns)
        if ok:
            return Isolation.NAMESPACES, prefix, "user namespace" if userns else "root"
        why = f"{' '.join(prefix[:2])}...: {why}"
    return Isolation.NONE, [], why


def launcher(isolation: Isolation) -> tuple[list[str], bool]:
    """(the command prefix, whether it makes a user namespace) for `isolation`."""
    if isolation is Isolation.NONE:
        return [], False
    found, prefix, why = detect()
    if found is Isolation.NONE:
        raise SandboxError(f"no namespace isolation on this machine ({why}); install util-linux's unshare, "
                           "allow user namespaces, or set reward.code.sandbox=none to run programs unisolated")
    return prefix, "--user" in prefix


def start(program: str, limits: Limits, prefix: list[str], userns: bool, recv_fd: int,
          send_fd: int) -> subprocess.Popen:
    """The program's process, started and fed; `recv_fd` and `send_fd` become its ends of the
    channel (the caller closes its copies). Raises OSError when it cannot start."""
    spec = {"memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s, "file_mb": limits.file_mb,
            "processes": limits.processes, "open_files": limits.open_files, "isolate": bool(prefix),
            "in_userns": userns, "workdir": WORKDIR, "hide": list(hidden_paths()) if prefix else [],
            "marker": MARKER, "uid": _UIDS + secrets.randbelow(_UIDS_SPAN)}
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-I", "-S", "-c", BOOT, json.dumps(spec)],
            stdin=theirs, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, cwd="/",
            start_new_session=True,
        )
    finally:
        theirs.close()
    try:
        socket.send_fds(ours, [b"c"], [recv_fd, send_fd])
        ours.sendall(code_blob(RUNNER_MODULES) + program.encode("utf-8", "surrogatepass"))
        ours.shutdown(socket.SHUT_WR)
    except OSError:  # it died at start: the caller sees it exit
        pass
    finally:
        ours.close()
    return proc


def probe(prefix: list[str], userns: bool, timeout_s: float = 10.0) -> tuple[bool, str]:
    """Whether a sandboxed `pass` comes up and says it is ready, and if not, why."""
    from mentor_fast.rewards.inside import wire

    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    try:
        proc = start("pass", Limits(), prefix, userns, to_r, from_w)
    except OSError as e:
        return False, f"cannot start: {e}"
    finally:
        os.close(to_r)
        os.close(from_w)
    try:
        ready = select.select([from_r], [], [], timeout_s)[0]
        first = wire.Reader(from_r).next() if ready else None
        ok = isinstance(first, dict) and "ready" in first
    except (OSError, wire.Malformed):
        ok = False
    finally:
        os.close(to_w)
        os.close(from_r)
        proc.kill()
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        proc.wait()
    return ok, "" if ok else f"exit {proc.returncode}: {err.decode('utf-8', 'replace')[-300:]}"
