"""Code rewards: run a program and its tests in the sandbox (rewards/sandbox.py) and say what happened.

`run_tests(program, tests, timeout_s)` runs `program` and then `tests` in one fresh interpreter,
as HumanEval does (`tests` is the problem's `test` source plus `check(entry_point)`). Passed means
the tests ran to their end without an exception; the exit status alone never means passed. The
other fields are the diagnosis the code mentor reads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mentor_fast.rewards.sandbox import Isolation, Limits, SandboxRun, run_python

TAIL = 2000  # characters kept of stdout, stderr and the traceback


@dataclass(frozen=True)
class CodeResult:
    passed: bool
    status: str  # passed, failed (an assertion of the tests), error (any other exception), timeout,
    # crashed (killed, or exited before the tests finished), sandbox_error
    exception: str = ""  # the exception's type, e.g. "AssertionError", "NameError"
    message: str = ""
    test_line: str = ""  # the source line of the tests that failed, when the failure is in the tests
    traceback: str = ""  # its tail
    stdout: str = ""  # tails
    stderr: str = ""
    wall_s: float = 0.0


def run_tests(program: str, tests: str, timeout_s: float, *, limits: Limits | None = None,
              isolation: Isolation = Isolation.NAMESPACES) -> CodeResult:
    run = run_python(program, tests, timeout_s, limits or Limits(), isolation)
    return classify(run)


def run_many(jobs: Sequence[tuple[str, str]], timeout_s: float, *, workers: int = 0,
             limits: Limits | None = None, isolation: Isolation = Isolation.NAMESPACES) -> list[CodeResult]:
    """(program, tests) pairs -> their results, in order, at most `workers` at a time (0: one per
    core). Each program has its own wall-clock timeout, so a hung one costs its slot `timeout_s`
    and stalls nothing else; the batch ends within about ceil(n / workers) timeouts."""
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=min(workers, max(1, len(jobs))), thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run_tests(job[0], job[1], timeout_s, limits=limits, isolation=isolation),
                             jobs))


def classify(run: SandboxRun) -> CodeResult:
    tails = {"stdout": run.stdout[-TAIL:], "stderr": run.stderr[-TAIL:], "wall_s": run.wall_s}
    if run.status == "finished" and run.report is not None:
        r = run.report
        if r.get("passed"):
            return CodeResult(True, "passed", **tails)
        exc = r.get("exception", "")
        failed = exc == "AssertionError" and r.get("stage") == "tests"
        return CodeResult(False, "failed" if failed else "error", exc, r.get("message", ""),
                          r.get("test_line") or "", r.get("traceback", "")[-TAIL:], **tails)
    if run.status == "timeout":
        return CodeResult(False, "timeout", message=f"no verdict within {run.wall_s:.1f} s", **tails)
    if run.status == "sandbox_error":
        return CodeResult(False, "sandbox_error", message=run.detail, **tails)
    why = run.detail or (f"output over the cap ({', '.join(run.truncated)})" if run.truncated
                         else f"killed (exit {run.returncode})")
    return CodeResult(False, "crashed", message=why, **tails)
