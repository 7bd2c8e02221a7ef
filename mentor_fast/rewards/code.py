"""Code rewards: run a program in its sandbox and its tests in a checker beside it, and say what happened.

`run_tests(program, tests, timeout_s)` runs `program` in a sandboxed process of its own
(rewards/sandbox.py) and `tests` in a separate checker process (rewards/inside/checker.py, judge.py).
The tests call the program's functions through a channel that carries plain data only, and
compare in the checker, so nothing the program does in its own process can decide the verdict.
Passed means the tests ran to their end without an exception and the channel stayed sound; the
program's exit status never means passed. For HumanEval, `tests` is the problem's `test` plus
`check(entry_point)`, `setup` its prompt (trusted code the checker runs itself: helpers such as
`poly`) and `entry_point` the function the tests call, whatever the setup defines under that name.
The other fields of a CodeResult are the diagnosis the code mentor reads.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mentor_fast.rewards.judge import JudgeRun, judge
from mentor_fast.rewards.sandbox import Isolation, Limits, SandboxError, detect
from mentor_fast.rewards.verdict import Status, Verdict
from mentor_fast.types import Problem

if TYPE_CHECKING:
    from mentor_fast.config.schema import CodeRewardConfig

TAIL = 2000  # characters kept of stdout, stderr and the traceback
STATUSES = ("passed", "failed", "error", "timeout", "crashed", "sandbox_error", "bad_problem", "forged_output",
            "channel_closed", "unsupported")


@dataclass(frozen=True)
class CodeResult:
    passed: bool
    status: str  # one of STATUSES: passed; failed (an assertion of the tests); error (any other
    # exception, the program's or the tests', an AssertionError of the program's included); timeout;
    # crashed (the program's process died or exited before the tests finished, or passed an output
    # cap); sandbox_error (not the program's doing); bad_problem (the problem's setup or tests do not
    # compile, or its setup raised: no program can pass it); forged_output (it wrote on its channel
    # what is no well-formed answer); channel_closed (it closed its channel and lived on);
    # unsupported (the tests need what cannot cross or be honoured between two processes: a value
    # that is not plain data either way, an object of the program's, its function's source or
    # frames, a patch or trace active while calling it; see docs/code.md)
    exception: str = ""  # the exception's type, e.g. "AssertionError", "NameError"
    message: str = ""
    test_line: str = ""  # the source line of the tests that failed, when the failure is in the tests
    traceback: str = ""  # its tail
    stdout: str = ""  # tails
    stderr: str = ""
    wall_s: float = 0.0


@dataclass(frozen=True)
class Job:
    """One program and its tests; `entry_point` and `setup` as in `run_tests`."""

    program: str
    tests: str
    entry_point: str = ""
    setup: str = ""


def run_tests(program: str, tests: str, timeout_s: float, *, limits: Limits | None = None,
              isolation: Isolation = Isolation.NAMESPACES, entry_point: str = "", setup: str = "") -> CodeResult:
    """`program` in its sandbox, `tests` in the checker against it (see the module docstring).
    entry_point: the function the tests call, bound to the program's even where `setup` defines
    the name (HumanEval's prompt holds its stub); with `setup`, give it. Other names the tests use
    come from the setup, else from the program (its functions, plain values and stdlib modules)."""
    if setup and not entry_point:
        raise ValueError("run_tests: a setup needs the entry point (its stub must not stand in for the program's)")
    return classify(judge(program, tests, timeout_s, limits or Limits(), isolation, entry_point, setup))


def run_many(jobs: Sequence[Job | tuple[str, ...]], timeout_s: float, *, workers: int = 0,
             limits: Limits | None = None, isolation: Isolation = Isolation.NAMESPACES) -> list[CodeResult]:
    """Jobs (or (program, tests[, entry_point[, setup]]) tuples) -> their results, in order, at most
    `workers` at a time (0: one per core). Each program has its own wall-clock timeout, so a hung one
    costs its slot `timeout_s` and stalls nothing else; the batch ends within about
    ceil(n / workers) timeouts."""
    workers = workers or os.cpu_count() or 1
    jobs = [j if isinstance(j, Job) else Job(*j) for j in jobs]

    def one(j: Job) -> CodeResult:
        return run_tests(j.program, j.tests, timeout_s, limits=limits, isolation=isolation,
                         entry_point=j.entry_point, setup=j.setup)

    with ThreadPoolExecutor(max_workers=min(workers, max(1, len(jobs))), thread_name_prefix="sandbox") as pool:
        return list(pool.map(one, jobs))


def classify(run: JudgeRun) -> CodeResult:
    tails = {"stdout": run.stdout[-TAIL:], "stderr": run.stderr[-TAIL:], "wall_s": run.wall_s}
    if run.status == "judged" and run.verdict is not None:
        v = run.verdict
        if v.get("passed") and v.get("status") == "passed":
            return CodeResult(True, "passed", **tails)
        status, message = v.get("status", ""), v.get("message", "")
        if status == "channel_eof":
            status = "crashed" if run.exited else "channel_closed"
            message = (_ended(run) if run.exited else
                       "the program's process closed its channel to the checker and went on running")
        elif status == "checker_error":
            status, message = "sandbox_error", f"the checker failed: {v.get('exception')}: {message}"
        elif status not in STATUSES:
            status, message = "sandbox_error", f"the checker said {status!r}: {message}"
        return CodeResult(False, status, v.get("exception", ""), message, v.get("test_line") or "",
                          v.get("traceback", "")[-TAIL:], **tails)
    if run.status == "timeout":
        return CodeResult(False, "timeout", message=f"no verdict within {run.wall_s:.1f} s", **tails)
    if run.status == "sandbox_error":
        return CodeResult(False, "sandbox_error", message=run.detail, **tails)
    why = f"output over the cap ({', '.join(run.truncated)})" if run.truncated else f"killed (exit {run.returncode})"
    return CodeResult(False, "crashed", message=why, **tails)


def _ended(run: JudgeRun) -> str:
    code = run.returncode
    if code is not None and code < 0:
        return f"killed by signal {-code} before the tests finished"
    if code is not None and code > 128:  # unshare reports its child's death by signal n as 128 + n
        return f"killed by signal {code - 128} before the tests finished"
    return f"exited with {code} before the tests finished"


def note_for(result: CodeResult) -> str:
    """The one-line verifier note the mentor and the logs read."""
    if result.passed:
        return "all tests passed"
    if result.status == "failed":
        return f"failed {result.test_line.strip() or 'a test'}" + (f" ({result.message})" if result.message else "")
    if result.status == "error":
        where = f" at {result.test_line.strip()}" if result.test_line else ""
        return f"{result.exception}: {result.message}{where}"[:300]
    return f"{result.status}: {result.message}"[:300]


def _verdict(code: str | None, result: CodeResult | None) -> Verdict:
    if code is None or result is None:
        return Verdict(False, None, "no code in the completion", Status.NO_ANSWER)
    status = Status.OK
    if result.status == "timeout":
        status = Status.TIMEOUT
    elif result.exception == "SyntaxError" and result.status == "error":
        status = Status.UNPARSEABLE
    elif result.status in ("sandbox_error", "bad_problem"):
        status = Status.ERROR
    error = {"sandbox_error": "SandboxError", "bad_problem": "BadProblem"}.get(result.status, "")
    error = "Timeout" if status is Status.TIMEOUT else error
    return Verdict(result.passed, code, note_for(result), status, error, detail=result)


class CodeVerifier:
    """The `code` reward kind: each completion's program (rewards/program.py) in the sandbox, its
    problem's tests in a checker beside it (the prompt as trusted setup), in a bounded pool.
    Isolation is checked when the verifier is built, so a machine without namespaces stops the run
    before the first step, with the way out in the error."""

    def __init__(self, cfg: CodeRewardConfig):
        self.timeout_s, self.workers = cfg.timeout_s, cfg.workers
        self.limits = Limits(memory_mb=cfg.memory_mb, cpu_s=cfg.cpu_s, output_bytes=cfg.output_kb * 1024)
        self.isolation = Isolation(cfg.sandbox)
        self._how = "NOT isolated (reward.code.sandbox=none)"
        if self.isolation is Isolation.NAMESPACES:
            found, prefix, why = detect()
            if found is Isolation.NONE:
                raise SandboxError(f"task=code: no namespace isolation on this machine ({why}); install "
                                   "util-linux's unshare, allow user namespaces, or set reward.code.sandbox=none "
                                   "to run the model's programs unisolated")
            self._how = f"`{' '.join(os.path.basename(a) if i == 0 else a for i, a in enumerate(prefix))}` ({why})"
        self._counts: collections.Counter[str] = collections.Counter()

    def describe(self) -> str:
        return (f"code: programs and tests in the sandbox, {self._how}, the tests in a checker process of "
                f"their own, {self.timeout_s:g} s wall, "
                f"{self.limits.memory_mb} MB, {self.workers or os.cpu_count()} at a time")

    def check(self, completions: list[str], problems: list[Problem]) -> list[Verdict]:
        from mentor_fast.rewards.program import extract_code, program_from_code

        if len(completions) != len(problems):
            raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
        codes, jobs, where = [], [], []
        for i, (text, p) in enumerate(zip(completions, problems, strict=True)):
            if p.code is None:
                raise ValueError(f"problem {p.id!r} ({p.source}) has no code task; task=code needs code data")
            code = extract_code(text)
            program = program_from_code(code, p.code) if code is not None else None
            codes.append(code)
            if program is not None:
                jobs.append(Job(program, p.code.tests, p.code.entry_point, p.code.prompt))
                where.append(i)
        results: list[CodeResult | None] = [None] * len(completions)
        done = run_many(jobs, self.timeout_s, workers=self.workers, limits=self.limits, isolation=self.isolation)
        for i, r in zip(where, done, strict=True):
            results[i] = r
        self._counts.update("no_code" if r is None else r.status for r in results)
        return [_verdict(c, r) for c, r in zip(codes, results, strict=True)]

    def pop_metrics(self) -> dict[str, float]:
        out = {f"reward/code/status/{k}": float(v) for k, v in self._counts.items()}
        self._counts.clear()
        return out

    def close(self) -> None:
        pass  # nothing outlives a run: each program's namespace dies with it
