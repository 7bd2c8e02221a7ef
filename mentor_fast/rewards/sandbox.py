"""Running a program a model wrote: a fresh interpreter in namespaces of its own, on one node, no service.

Isolation (`unshare` from util-linux, detected at start; `Isolation.NONE` only when asked for):
- PID, network, mount, IPC and UTS namespaces. The program sees no process of the host (it cannot
  signal the trainer), and no network: the namespace's loopback is down, so even 127.0.0.1 is
  unreachable. When the namespace's first process ends, the kernel kills every process in it,
  so nothing the program started (a setsid daemon included) outlives the call.
- Filesystem: every mount is remounted read-only; /tmp and /dev/shm are fresh tmpfs mounts of the
  namespace (gone with it; inside it these names are the namespace's own, not the host's), and
  the program runs in WORKDIR there. Whatever lives under the host's /tmp (a checkout, say) is
  hidden from the program, not just read-only.
- Privileges: the mounts are set up first, then the process gives its privileges up: as host root
  it becomes uid/gid 65534 (with its interpreter's installation bound under /tmp, read-only, in
  case only root could reach it); under an unprivileged user namespace it enters a nested one.
  Either way it holds no capability over the mounts, so it cannot remount them writable, and
  RLIMIT_NPROC counts against a uid that is not root's (root is exempt from it).
- Environment: empty. Limits (rlimits): address space, CPU seconds, file size, processes, open
  files. Output: each stream is read up to a cap; past it the program is killed.
- Timeout: wall clock; the whole namespace is killed (SIGKILL) when it runs out.

The program and its tests travel on stdin; the verdict comes back on a pipe of its own and
is written only after the tests ran to their end, so an early `sys.exit(0)` or `os._exit(0)` is
"exited before the tests finished", never a pass.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cache

from mentor_fast.compat import StrEnum

WORKDIR = "/tmp/work"  # inside the namespace, on its own tmpfs (see the module docstring)


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


@dataclass
class SandboxRun:
    status: str  # "finished" (the harness reported), "exited" (no report), "timeout", "killed", "sandbox_error"
    report: dict | None = None  # the harness's verdict (see HARNESS)
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    detail: str = ""
    truncated: list[str] = field(default_factory=list)  # streams cut at the cap


# Runs as the namespace's first process: mounts, privileges, limits, then the program and tests.
# argv: limits as JSON. stdin: {"program": ..., "tests": ...}. report_fd: the verdict.
HARNESS = r'''
import ctypes, json, os, resource, sys, traceback
limits = json.loads(sys.argv[1])
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
libc = ctypes.CDLL(None, use_errno=True)
def mount(src, target, fstype, flags, data):
    if libc.mount(src, target.encode(), fstype, flags, data) != 0:
        raise OSError(ctypes.get_errno(), "mount " + target)
if limits["isolate"]:
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    points = []
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        points.append((f[4].encode().decode("unicode_escape"), f[5]))
    for point, opts in sorted(points, key=lambda p: p[0].count("/")):
        extra = sum(FLAGS.get(o, 0) for o in opts.split(","))
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | extra, None)
        except OSError:
            if point in ("/", os.path.dirname(os.path.abspath(sys.executable))):
                raise
    size = ("size=%dm,mode=1777" % (4 * limits["file_mb"])).encode()
    base = sys.base_prefix
    base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)  # still reachable if it lives under /tmp
    mount(b"tmpfs", "/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, size)
    if os.path.isdir("/dev/shm"):
        mount(b"tmpfs", "/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, size)
    os.mkdir(limits["workdir"], 0o1777)
    if os.getuid() == 0 and not limits["in_userns"]:
        # Host root gives its uid up (so RLIMIT_NPROC binds). The interpreter may live where only
        # root can reach it (/root/.pyenv): its installation is bound under /tmp, read-only.
        os.mkdir("/tmp/.python", 0o755)
        mount(("/proc/self/fd/%d" % base_fd).encode(), "/tmp/.python", None, MS_BIND | MS_REC, None)
        mount(None, "/tmp/.python", None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        moved = lambda p: p.replace(base, "/tmp/.python", 1) if p.startswith(base) else p
        sys.path[:] = [moved(p) for p in sys.path]
        for m in list(sys.modules.values()):  # packages already imported look for submodules here
            if isinstance(getattr(m, "__path__", None), list):
                m.__path__[:] = [moved(p) for p in m.__path__]
        sys.path_importer_cache.clear()
        os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
    elif libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER: no capability over the mounts above
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    os.close(base_fd)
    os.chdir(limits["workdir"])
mb = 1 << 20
for name, value in (("RLIMIT_AS", limits["memory_mb"] * mb), ("RLIMIT_CPU", limits["cpu_s"]),
                    ("RLIMIT_FSIZE", limits["file_mb"] * mb), ("RLIMIT_NPROC", limits["processes"]),
                    ("RLIMIT_NOFILE", limits["open_files"])):
    resource.setrlimit(getattr(resource, name), (value, value))
job = json.loads(sys.stdin.read())
fd = os.open(os.devnull, os.O_RDONLY); os.dup2(fd, 0); os.close(fd)
report = os.fdopen(limits["report_fd"], "w")
os.set_inheritable(limits["report_fd"], False)
scope = {"__name__": "__main__", "__builtins__": __builtins__}
stage = "program"
try:
    exec(compile(job["program"], "<program>", "exec"), scope)
    stage = "tests"
    exec(compile(job["tests"], "<tests>", "exec"), scope)
    verdict = {"passed": True}
except BaseException as e:  # SystemExit included: the tests did not run to their end
    tb = traceback.extract_tb(e.__traceback__)
    src = job["tests"].splitlines()  # exec'd source has no file, so the line comes from here
    no = next((fr.lineno for fr in reversed(tb) if fr.filename == "<tests>"), None)
    line = src[no - 1].strip() if no and no <= len(src) else None
    verdict = {"passed": False, "stage": stage, "exception": type(e).__name__, "message": str(e)[:500],
               "test_line": line, "traceback": "".join(traceback.format_exception(e))[-2000:]}
for stream in (sys.stdout, sys.stderr):
    try:  # the program may have closed or replaced them: what it printed is then lost, not the verdict
        stream.flush()
    except (AttributeError, OSError, ValueError):
        pass
try:
    report.write(json.dumps(verdict)); report.flush()
except (OSError, ValueError):  # the program closed the verdict pipe: no verdict, counted as crashed
    pass
os._exit(0)
'''


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
        run = _launch(prefix, userns, "", "pass", 10.0, Limits())
        if run.status == "finished" and run.report and run.report.get("passed"):
            return Isolation.NAMESPACES, prefix, "user namespace" if userns else "root"
        why = f"{' '.join(prefix[:2])}...: {run.status} {run.detail} {run.stderr[-300:]}"
    return Isolation.NONE, [], why


def run_python(program: str, tests: str, timeout_s: float, limits: Limits = Limits(),
               isolation: Isolation = Isolation.NAMESPACES) -> SandboxRun:
    """`program` then `tests` in one fresh interpreter, isolated; see the module docstring."""
    if isolation is Isolation.NONE:
        return _launch([], False, program, tests, timeout_s, limits)
    found, prefix, why = detect()
    if found is Isolation.NONE:
        raise SandboxError(f"no namespace isolation on this machine ({why}); install util-linux's unshare, "
                           "allow user namespaces, or set reward.code.sandbox=none to run programs unisolated")
    return _launch(prefix, "--user" in prefix, program, tests, timeout_s, limits)


def _launch(prefix: list[str], userns: bool, program: str, tests: str, timeout_s: float,
            limits: Limits) -> SandboxRun:
    spec = {"memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s, "file_mb": limits.file_mb,
            "processes": limits.processes, "open_files": limits.open_files, "isolate": bool(prefix),
            "in_userns": userns, "workdir": WORKDIR}
    r, w = os.pipe()
    spec["report_fd"] = w
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-I", "-S", "-c", HARNESS, json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={},
            cwd="/", pass_fds=(w,), start_new_session=True,
        )
    except OSError as e:
        os.close(r)
        os.close(w)
        return SandboxRun("sandbox_error", detail=f"cannot start: {e}")
    os.close(w)
    out = _Collector(proc, r, limits.output_bytes)
    try:
        proc.stdin.write(json.dumps({"program": program, "tests": tests}).encode())
        proc.stdin.close()
    except OSError:
        pass
    status = out.wait(t0 + timeout_s)
    run = SandboxRun(status, returncode=proc.returncode, wall_s=time.monotonic() - t0,
                     stdout=out.text("stdout"), stderr=out.text("stderr"), truncated=out.cut)
    if status == "exited" and out.report:
        try:
            run.report, run.status = json.loads(out.report), "finished"
        except ValueError:
            run.detail = "the verdict pipe held garbage"
    if run.status == "exited":
        run.detail = run.detail or f"exited with {proc.returncode} before the tests finished"
    return run


class _Collector:
    """Reads stdout, stderr and the verdict pipe without blocking on any; kills on a cap or a deadline."""

    def __init__(self, proc: subprocess.Popen, report_fd: int, cap: int):
        self.proc, self.cap = proc, cap
        self.bufs = {"stdout": bytearray(), "stderr": bytearray()}
        self.cut: list[str] = []
        self.report = b""
        self.fds = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", report_fd: "report"}
        self._report_fd = report_fd

    def wait(self, deadline: float) -> str:
        import selectors

        sel = selectors.DefaultSelector()
        for fd in self.fds:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        status = None
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    status = "timeout"
                    break
                for key, _ in sel.select(min(left, 0.5)):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    name = self.fds[key.fd]
                    if name == "report":
                        self.report += chunk[: 1 << 20]
                        continue
                    buf = self.bufs[name]
                    buf += chunk[: max(0, self.cap - len(buf))]
                    if len(buf) >= self.cap and name not in self.cut:
                        self.cut.append(name)
                if self.cut:
                    status = "killed"
                    break
        finally:
            if status is not None:
                self._kill()
            try:
                self.proc.wait(timeout=max(1.0, deadline - time.monotonic() + 5))
            except subprocess.TimeoutExpired:
                self._kill()
                self.proc.wait()
            sel.close()
            for fd in self.fds:
                if fd == self._report_fd:
                    os.close(fd)
            self.proc.stdout.close()
            self.proc.stderr.close()
        if status is None:
            status = "exited" if self.proc.returncode is not None and self.proc.returncode >= 0 else "killed"
        return status

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # unshare and, through --kill-child, the namespace
        except ProcessLookupError:
            pass

    def text(self, name: str) -> str:
        return bytes(self.bufs[name]).decode("utf-8", "replace")
