"""The code sandbox against hostile programs and honest ones (mentor_fast/rewards/sandbox.py, code.py).

Every hostile program must not pass, must come back within its timeout + 10 s, must leave no file,
process or connection behind, and must leave the caller alive."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from mentor_fast.rewards import judge, sandbox
from mentor_fast.rewards.code import run_tests

TIMEOUT = 3.0
ROOT = Path(__file__).resolve().parents[1]
SECRET = "mentor-fast-test-secret-8f3a"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _ours(pid: int) -> bool:
    """A descendant of this test process, or an orphan (a leak outlives its parent): another
    process's sandboxes on the same machine are not this test's leaks."""
    chain = [_parent(pid)]
    while chain[-1] > 1 and len(chain) < 64:
        chain.append(_parent(chain[-1]))
    return chain[0] == 1 or os.getpid() in chain


def _harness_processes() -> list[int]:
    """Live sandboxed programs and checkers of this test process (what a leak would leave). A
    checker may take a moment to be gone after it sent its verdict, so this waits up to a second
    for the list to empty."""
    deadline = time.monotonic() + 1.0
    while True:
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                ppid = _parent(int(pid))
                zygote = judge.ZYGOTE.pid() is not None and ppid == judge.ZYGOTE.pid()
                if zygote or (sandbox.MARKER.encode() in cmd and _ours(int(pid))):
                    out.append(int(pid))
            except (OSError, IndexError, ValueError):  # gone while read
                continue
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.02)


@pytest.fixture(autouse=True)
def _namespaces():
    found, _, why = sandbox.detect()
    assert found is sandbox.Isolation.NAMESPACES, f"namespace isolation must work on this machine: {why}"


HOSTILE = {
    "sys_exit_before_tests": "import sys\nsys.exit(0)",
    "os_exit_before_tests": "import os\nos._exit(0)",
    "busy_loop_ignoring_signals": ("import signal\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT):\n"
                                   "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"),
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(64 << 20))",
    "write_into_the_project": f"open({str(ROOT / 'SANDBOX_ESCAPE')!r}, 'w').write('x')",
    "write_into_system_temp": f"open({tempfile.gettempdir()!r} + '/SANDBOX_ESCAPE', 'w').write('x')\nraise SystemExit",
    "connect_to_localhost": ("import socket\ns = socket.create_connection(('127.0.0.1', 22), timeout=2)\n"
                             "s.sendall(b'hello')"),
    "read_a_secret_from_the_environment": f"import os\nassert os.environ['MF_SECRET'] == {SECRET!r}",
    "fork_storm": "import os\nwhile True:\n    os.fork()",
    "setsid_daemon": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    "
                      f"open({str(ROOT / 'SANDBOX_DAEMON')!r}, 'w')\nelse:\n    raise SystemExit(0)"),
    "gigabytes_of_output": "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)",
    "kill_the_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\nraise SystemExit",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_does_not_pass_and_leaves_nothing(name, monkeypatch):
    monkeypatch.setenv("MF_SECRET", SECRET)  # in the caller's environment, where a leak would find it
    before = set(os.listdir(tempfile.gettempdir()))
    t0 = time.monotonic()
    result = run_tests(HOSTILE[name], "assert True", TIMEOUT)
    assert not result.passed, result
    assert time.monotonic() - t0 < TIMEOUT + 10
    assert not (ROOT / "SANDBOX_ESCAPE").exists()
    assert not (ROOT / "SANDBOX_DAEMON").exists()
    assert "SANDBOX_ESCAPE" not in set(os.listdir(tempfile.gettempdir())) - before
    assert _harness_processes() == []  # nothing it started outlives the call
    assert SECRET not in result.stdout + result.stderr + result.message


def test_what_the_hostile_programs_run_into():
    """The statuses say why: a fake exit is not a pass, a loop times out, the output cap kills."""
    project = ("FileNotFoundError", "No such file or directory")  # the sandbox's root has no checkout
    expect = {"sys_exit_before_tests": ("error", "SystemExit"), "os_exit_before_tests": ("crashed", ""),
              "busy_loop_ignoring_signals": ("timeout", ""), "memory_bomb": ("error", "MemoryError"),
              "write_into_the_project": ("error", project[0]), "connect_to_localhost": ("error", "OSError"),
              "read_a_secret_from_the_environment": ("error", "KeyError"), "gigabytes_of_output": ("crashed", "")}
    for name, (status, exc) in expect.items():
        # the bomb writes a gigabyte before the limit stops it: seconds on a shared 2-core machine
        r = run_tests(HOSTILE[name], "assert True", 15.0 if name == "memory_bomb" else TIMEOUT)
        assert (r.status, r.exception) == (status, exc), (name, r)
    assert project[1] in run_tests(HOSTILE["write_into_the_project"], "", TIMEOUT).message
    assert "unreachable" in run_tests(HOSTILE["connect_to_localhost"], "", TIMEOUT).message
    assert "cap" in run_tests(HOSTILE["gigabytes_of_output"], "", TIMEOUT).message


HONEST = {
    "stdlib_imports": ("import json, re, math, itertools, collections, fractions, decimal, heapq, bisect, "
                       "functools, socket, sqlite3\ndef f():\n    return json.dumps(sorted({3, 1, 2}))"),
    "deep_recursion": ("import sys\nsys.setrecursionlimit(20000)\ndef depth(n):\n    return 0 if n == 0 else "
                       "1 + depth(n - 1)\ndef f():\n    return depth(5000)"),
    "a_tempfile": ("import tempfile\ndef f():\n    with tempfile.TemporaryFile() as t:\n        t.write(b'abc')\n"
                   "        t.seek(0)\n        return t.read()"),
    "seconds_of_cpu": ("import time\ndef f():\n    t = time.process_time()\n    n = 0\n    while time.process_time()"
                       " - t < 1.0:\n        n += 1\n    return n > 0"),
    "printing": "def f():\n    for i in range(1000):\n        print('line', i)\n    return True",
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_program_passes(name):
    r = run_tests(HONEST[name], "assert f()", 10.0)
    assert r.passed and r.status == "passed", r
    if name == "printing":
        assert "line 999" in r.stdout


def test_a_failing_test_names_its_line_and_exception():
    program = "def add(a, b):\n    return a - b\n"
    tests = "def check(fn):\n    assert fn(1, 1) == 2, 'add(1, 1)'\ncheck(add)\n"
    r = run_tests(program, tests, 5.0)
    assert (r.passed, r.status, r.exception, r.message) == (False, "failed", "AssertionError", "add(1, 1)")
    assert r.test_line == "assert fn(1, 1) == 2, 'add(1, 1)'"
    assert "AssertionError" in r.traceback
    r = run_tests("def add(a, b)\n    return a + b\n", tests, 5.0)
    assert (r.status, r.exception) == ("error", "SyntaxError")
    r = run_tests("def plus(a, b):\n    return a + b\n", tests, 5.0)
    assert (r.status, r.exception) == ("error", "NameError") and "add" in r.message


def test_fault_injection_no_unshare_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.detect.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxError, match="no namespace isolation.*reward.code.sandbox=none"):
            run_tests("x = 1", "", 5.0)
        r = run_tests("def f():\n    return 1", "assert f() == 1", 5.0, isolation=sandbox.Isolation.NONE)
        assert r.passed  # asked for explicitly: runs, unisolated
    finally:
        monkeypatch.undo()
        sandbox.detect.cache_clear()


def test_a_batch_runs_in_a_bounded_pool_and_one_hung_program_stalls_nothing():
    from mentor_fast.rewards.code import run_many

    jobs = [("def f():\n    return 1", "assert f() == 1"), (HOSTILE["busy_loop_ignoring_signals"], "assert True"),
            ("def f():\n    return 2", "assert f() == 1"), ("def f():\n    return 3", "assert f() == 3")]
    t0 = time.monotonic()
    results = run_many(jobs, timeout_s=2.0, workers=2)
    assert [r.status for r in results] == ["passed", "timeout", "failed", "passed"]
    assert time.monotonic() - t0 < 2.0 + 5  # the hung program held one slot; the rest ran beside it
    assert _harness_processes() == []


def _bpf(insns, arch: int, nr: int, arg1: int = 0) -> int:
    """What a classic-BPF seccomp program returns for one call (the instructions seccomp.py uses)."""
    data = {0: nr, 4: arch, 24: arg1}
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = data[k]
        elif code == 0x06:
            return k
        else:
            taken = acc == k if code == 0x15 else acc >= k
            pc += jt if taken else jf
        pc += 1


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_seccomp_filter_decides_each_call_as_documented(arch):
    """The filter read instruction by instruction, for both architectures it knows (the x86_64 one
    also runs for real in tests/test_code_forgery.py): locks return 0 and do nothing, the calls
    whose state crosses namespaces fail with EPERM, everything else is allowed, and a call of
    another ABI fails with ENOSYS."""
    from mentor_fast.rewards.inside import seccomp

    audit, nr, _ = seccomp._ARCHES[arch]
    insns = seccomp.program(arch)
    allow, ok, eperm, enosys = 0x7FFF0000, 0x00050000, 0x00050000 | 1, 0x00050000 | 38
    assert _bpf(insns, audit, nr["flock"]) == ok
    for cmd in (seccomp.F_SETLK, seccomp.F_SETLKW, seccomp.F_OFD_SETLK, seccomp.F_OFD_SETLKW):
        assert _bpf(insns, audit, nr["fcntl"], cmd) == ok
    for cmd in (seccomp.F_SETLEASE, seccomp.F_NOTIFY):
        assert _bpf(insns, audit, nr["fcntl"], cmd) == eperm
    for cmd in (1, 3, 4, 5, 1030):  # F_GETFD, F_GETFL, F_SETFL, F_GETLK, F_DUPFD_CLOEXEC
        assert _bpf(insns, audit, nr["fcntl"], cmd) == allow
    for name in set(nr) - {"flock", "fcntl"}:
        assert _bpf(insns, audit, nr[name]) == eperm, name
    for other in (0, 1, 2, 63, 200, 400):  # read, write, open..., none of the filtered
        if other not in nr.values():
            assert _bpf(insns, audit, other) == allow
    assert _bpf(insns, 0x40000003, 3) == enosys  # i386
    if arch == "x86_64":
        assert _bpf(insns, audit, 0x40000000 | 73) == enosys  # x32
