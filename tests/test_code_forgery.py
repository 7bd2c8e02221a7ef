"""Programs that try to forge a pass instead of solving, second set (rewards/inside/checker.py, channel.py,
runner.py, wire.py, decoder.py, seccomp.py), written after reading the redesigned checker.

One test per class, each hostile program in both styles (plain asserts on the program's name, and
HumanEval's `check(candidate)` with a prompt as the trusted setup) beside honest programs that must
pass through the same path, so a checker that refused everything would fail here too:
1. expected values never reach the program's process;
2. exceptions the program raises never steer the tests' control flow;
3. a setup or tests that do not compile are a bad problem, never dropped;
4. what the tests observe is the program (identity, aliasing, changes in place, its recursion
   limit and printed output), or the verdict says `unsupported` (its source, frames, patches);
5. sandboxes side by side cannot signal each other;
6. honest values cross (b"", Counter, defaultdict, namedtuple, exception args...), and what cannot
   is unsupported, never forged.
(tests/test_code_channel.py holds the first set.)"""

from __future__ import annotations

import os
import textwrap

import pytest

from mentor_fast.rewards import sandbox
from mentor_fast.rewards.code import Job, run_many

TIMEOUT = 5.0
PROMPT = 'import math\n\n\ndef add(a: int, b: int) -> int:\n    """The sum of a and b."""\n'
HONEST = "def add(a, b):\n    return a + b\n"


@pytest.fixture(autouse=True)
def _namespaces():
    found, _, why = sandbox.detect()
    assert found is sandbox.Isolation.NAMESPACES, f"namespace isolation must work on this machine: {why}"


def _styles(body: str, entry: str, prompt: str) -> list[tuple[str, str, str]]:
    """`body` (test lines that call `{f}`) as plain asserts on the program's name, and as
    check(candidate) with `prompt` as the setup."""
    check = "def check(candidate):\n" + textwrap.indent(body.replace("{f}", "candidate"), "    ") + f"\n\ncheck({entry})\n"
    return [(body.replace("{f}", entry), "", ""), (check, entry, prompt)]


def _judge(cases: dict[str, tuple[str, str]], entry: str, prompt: str, timeout: float = TIMEOUT) -> dict[str, list]:
    """{name: (program, body)} -> {name: [plain result, check result]}."""
    jobs = [Job(program, tests, ep, setup) for program, body in cases.values()
            for tests, ep, setup in _styles(body, entry, prompt)]
    results = run_many(jobs, timeout, workers=2)
    return {n: results[2 * i: 2 * i + 2] for i, n in enumerate(cases)}


def _status(results: dict[str, list]) -> dict[str, str]:
    """Each case's status, the same in both styles (or both, joined by a slash)."""
    return {n: "/".join(dict.fromkeys(r.status for r in rs)) for n, rs in results.items()}


GREET = 'def greet(name: str) -> str:\n    """A greeting word for the name."""\n'
WORDS = ["bob", "ann", "hello", "world", "yes", "no", "ok", "true", "false", "none", "abc", "xyz", "greet"]
SPY = f'''import gc
WORDS = {WORDS!r}
SEEN = []
_srv = next(o for o in gc.get_objects() if type(o).__name__ == "Server")
_next = _srv.reader.next
def _record():
    msg = _next()
    SEEN.append(repr(msg))
    return msg
_srv.reader.next = _record
for _w in WORDS:  # every word a name of its own, a value or a function: the checker once fetched
    if _w != "greet":  # the values whose names the tests held as strings
        globals()[_w] = _w if len(_w) % 2 else (lambda: 0)
def greet(name):
    print("SEEN", SEEN)
    return next((w for t in SEEN for w in WORDS if repr(w) in t and w not in (name, "greet")), "?")
'''


def test_expected_values_never_reach_the_programs_process():
    """Class 1: the program records every request it gets and returns any word in them that is not
    its argument. The tests' expected words are identifiers; none is ever named to the program,
    whatever names it defines. What legitimately crosses: the names the tests call, their arguments."""
    body = 'assert {f}("bob") == "hello"\nassert {f}("ann") == "world"\n'
    apps = ('import json\n_fn = globals()["greet"]\nfor _args, _want in json.loads(\'[[["bob"], "hello"]]\'):\n'
            '    assert _fn(*_args) == _want\n')
    honest = "def greet(name):\n    return {'bob': 'hello', 'ann': 'world'}[name]\n"
    results = _judge({"spy": (SPY, body), "honest": (honest, body)}, "greet", GREET)
    apps_jobs = [Job(SPY, apps, "greet"), Job(honest, apps, "greet"), Job(SPY, apps), Job(honest, apps)]
    results["apps_call_style"] = run_many(apps_jobs, TIMEOUT, workers=2)
    assert [r.status for r in results["apps_call_style"]] == ["failed", "passed"] * 2, results["apps_call_style"]
    assert _status(results) == {"spy": "failed", "honest": "passed", "apps_call_style": "failed/passed"}
    for r in results["spy"] + results["apps_call_style"][::2]:
        seen = r.stdout.partition("SEEN")[2]
        assert "'bob'" in seen and "hello" not in seen and "world" not in seen, r.stdout


STOP = "def add(a, b):\n    raise {exc}\n"
ENDS_DATA = {  # tests whose loop or reduction a StopIteration from the program would end early
    "all_over_map": "assert all({f}(a, b) == a + b for a, b in [(2, 3)]) and all(map({f}, [2], [3]))\n",
    "for_over_map": "for got in map({f}, [2, -1], [3, 1]):\n    assert got in (5, 0)\n",
    "list_of_map": "got = list(map({f}, [2], [3]))\nassert all(g == 5 for g in got)\n",
    "zip_with_map": "for g, w in zip(map({f}, [2], [3]), [5]):\n    assert g == w\n",
    "async_for": ("import asyncio\nclass Calls:\n    def __init__(self):\n        self.i = 0\n    def __aiter__(self):\n"
                  "        return self\n    async def __anext__(self):\n        self.i += 1\n        if self.i > 2:\n"
                  "            raise StopAsyncIteration\n        return ({f}(self.i, 1), self.i)\n"
                  "async def run():\n    async for got, i in Calls():\n        assert got == i + 1\n"
                  "asyncio.run(run())\n"),
}
SKIPS_ON_ANY = ("for a, b in [(2, 3), (1, 1)]:\n    try:\n        got = {f}(a, b)\n    except BaseException:\n"
                "        continue\n    assert got == a + b\n")


def test_exceptions_the_program_raises_never_steer_the_tests():
    """Class 2. StopIteration and StopAsyncIteration end `map`, `zip`, `all` or `async for` as if the
    data were over: they reach the tests as a RuntimeError (PEP 479's rule for generators). SystemExit,
    KeyboardInterrupt, GeneratorExit and BaseException end the tests with an error that an `except
    BaseException: continue` cannot skip. The program's AssertionError is an error, not a failed
    test. A test that names StopIteration (it may mean to catch one) is unsupported."""
    cases = {f"stop_{n}": (STOP.format(exc="StopAsyncIteration" if n == "async_for" else "StopIteration"), body)
             for n, body in ENDS_DATA.items()}
    for exc in ("SystemExit(0)", "KeyboardInterrupt", "GeneratorExit", "BaseException('x')"):
        cases[f"skip_{exc.partition('(')[0]}"] = (STOP.format(exc=exc), SKIPS_ON_ANY)
    cases["own_assertion"] = ("def add(a, b):\n    assert a < 0, 'nope'\n", "assert {f}(2, 3) == 5\n")
    cases["tests_catch_stop"] = (STOP.format(exc="StopIteration"),
                                 "try:\n    {f}(2, 3)\nexcept StopIteration:\n    pass\nelse:\n    assert False\n")
    cases.update({f"honest_{n}": (HONEST, body) for n, body in (*ENDS_DATA.items(), ("skip", SKIPS_ON_ANY))})
    results = _judge(cases, "add", PROMPT)
    statuses = _status(results)
    assert {n: s for n, s in statuses.items() if n.startswith("honest_")} == {
        f"honest_{n}": "passed" for n in (*ENDS_DATA, "skip")}, results
    for name in ENDS_DATA:
        assert statuses[f"stop_{name}"] == "error", (name, results[f"stop_{name}"])
        assert {r.exception for r in results[f"stop_{name}"]} <= {"StopIteration", "StopAsyncIteration"}
    for name in ("SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException"):
        assert statuses[f"skip_{name}"] == "error", results[f"skip_{name}"]
        assert {r.exception for r in results[f"skip_{name}"]} == {name}
    assert statuses["own_assertion"] == "error" and results["own_assertion"][0].exception == "AssertionError"
    assert "nope" in results["own_assertion"][0].traceback and "<program>" in results["own_assertion"][0].traceback
    assert statuses["tests_catch_stop"] == "unsupported"


ARGS = {
    "value_error_args": ("def parse(s):\n    raise ValueError('bad input', s)\n",
                         ("try:\n    {f}('x')\nexcept ValueError as e:\n    assert e.args == ('bad input', 'x')\n"
                         "    assert str(e) == \"('bad input', 'x')\"\nelse:\n    assert False\n")),
    "own_subclass_of_value_error": ("class ParseError(ValueError):\n    pass\ndef parse(s):\n    raise ParseError(s)\n",
                                    ("try:\n    {f}('x')\nexcept ValueError as e:\n"
                                    "    assert type(e).__name__ == 'ParseError' and e.args == ('x',)\n"
                                    "else:\n    assert False\n")),
    "key_error_in_lookup_error": ("def parse(s):\n    return {}[s]\n",
                                  ("try:\n    {f}('k')\nexcept LookupError as e:\n    assert str(e) == \"'k'\"\n"
                                  "else:\n    assert False\n")),
    "os_error_errno": ("def parse(s):\n    raise FileNotFoundError(2, 'missing', s)\n",
                       ("try:\n    {f}('p')\nexcept OSError as e:\n    assert e.errno == 2 and e.filename == 'p'\n"
                       "else:\n    assert False\n")),
}
NAMED_LIKE_A_BUILTIN = ("class KeyError(Exception):\n    pass\ndef parse(s):\n    raise KeyError(s)\n",
                        "try:\n    {f}('k')\nexcept LookupError:\n    pass\n")
PARSE = 'def parse(s: str) -> int:\n    """The number in s."""\n'


def test_exceptions_keep_their_class_and_arguments_and_only_those():
    """Class 6 (exceptions): what an in-process test reads of the program's exception crosses: its
    built-in class (a class of the program's derived from ValueError is caught by `except
    ValueError`), its message, its plain-data args, OSError's errno. A class of the program's that
    merely borrows a built-in's name is not that built-in; args that are not plain data are
    unsupported when a test reads them, never made up."""
    cases = {**ARGS, "named_like_a_builtin": NAMED_LIKE_A_BUILTIN,
             "args_not_plain_read": ("def parse(s):\n    raise ValueError(object())\n",
                                     "try:\n    {f}('x')\nexcept ValueError as e:\n    assert e.args[0] is not None\n"),
             "args_not_plain_unread": ("def parse(s):\n    raise ValueError(object())\n",
                                       "try:\n    {f}('x')\nexcept ValueError as e:\n    assert 'object' in str(e)\n")}
    statuses = _status(_judge(cases, "parse", PARSE))
    assert statuses == {**{n: "passed" for n in ARGS}, "named_like_a_builtin": "error",
                        "args_not_plain_read": "unsupported", "args_not_plain_unread": "passed"}


HELPER_PROMPT = ('def norm(x):\n    return abs(x)\n\n\ndef add(a: int, b: int) -> int:\n')  # a stub with no body
HELPER_TESTS = "def check(candidate):\n    assert norm(candidate(-2, -3)) == 5\n\ncheck(add)\n"


def test_a_setup_or_tests_that_do_not_compile_are_a_bad_problem_never_dropped():
    """Class 3: a prompt whose stub has no body was dropped, and the tests' helper `norm` then bound
    to the program's (which says yes to anything). Now the problem is refused before any program is
    asked anything, for every program alike, with a status that names the problem, not the program;
    and a helper the tests define themselves is theirs even when the program has one too."""
    forger = "def norm(x):\n    return 5\n\n\ndef add(a, b):\n    return 0\n"
    honest = "def add(a, b):\n    return a + b\n"
    own_helper = ("def helper(x):\n    return abs(x)\n\ndef check(candidate):\n    assert helper(candidate(-2, -3)) == 5\n"
                  "\ncheck(add)\n")
    jobs = [Job(forger, HELPER_TESTS, "add", HELPER_PROMPT), Job(honest, HELPER_TESTS, "add", HELPER_PROMPT),
            Job(honest, HELPER_TESTS, "add", "import not_a_module_anywhere\n" + HELPER_PROMPT + "    pass\n"),
            Job(honest, "assert add(2, 3) == 5 +\n", "add"),
            Job(forger.replace("norm", "helper"), own_helper, "add"), Job(honest, own_helper, "add")]
    results = run_many(jobs, TIMEOUT, workers=2)
    assert [r.status for r in results] == ["bad_problem"] * 4 + ["failed", "passed"], results
    assert "setup does not compile (line 5)" in results[0].message and "IndentationError" == results[0].exception
    assert "setup raised" in results[2].message and results[2].exception == "ModuleNotFoundError"
    assert "tests does not compile" in results[3].message


OBSERVED = {  # (program, tests): what a test sees of the program in one process, and must see here
    "returns_its_argument": ("def f(xs):\n    xs.sort()\n    return xs\n",
                             "xs = [3, 1, 2]\nys = {f}(xs)\nassert ys == [1, 2, 3] and ys is not xs\n"),
    "shared_default_list": ("def f(x, acc=[]):\n    acc.append(x)\n    return acc\n",
                            "assert {f}(1) == [1]\nassert {f}(2) == [2]\n"),
    "same_object_twice": ("def f(x, acc=[]):\n    acc.clear()\n    acc.append(x)\n    return acc\n",
                          "a = {f}(1)\nb = {f}(2)\nassert a is not b\n"),
    "a_later_call_changes_an_earlier_result": ("def f(x, acc=[]):\n    acc.append(x)\n    return list(acc) if x > 1 else acc\n",
                                               "a = {f}(1)\n{f}(2)\nassert a == [1]\n"),
    "aliased_rows": ("def f(n):\n    return [[0] * n] * n\n", "g = {f}(3)\ng[0][0] = 1\nassert sum(map(sum, g)) == 1\n"),
    "mutates_its_input": ("def f(xs):\n    xs.sort()\n    return xs[0]\n",
                          "xs = [3, 1, 2]\nassert {f}(xs) == 1\nassert xs == [3, 1, 2], 'the input was changed'\n"),
}
HONEST_OBSERVED = {
    "returns_a_copy": ("def f(xs):\n    return sorted(xs)\n", OBSERVED["returns_its_argument"][1]),
    "fresh_list": ("def f(x, acc=None):\n    acc = [] if acc is None else acc\n    acc.append(x)\n    return acc\n",
                   OBSERVED["shared_default_list"][1] + OBSERVED["same_object_twice"][1]),
    "in_place_and_returned": ("def f(xs):\n    xs.sort()\n    return xs\n",
                              "xs = [3, 1, 2]\nassert {f}(xs) is xs and xs == [1, 2, 3]\n"),
    "rows_of_their_own": ("def f(n):\n    return [[0] * n for _ in range(n)]\n", OBSERVED["aliased_rows"][1]),
    "keeps_the_callers_list": ("S = []\ndef f(xs):\n    global S\n    S = xs\n    return len(S)\n",
                               "xs = [1]\nassert {f}(xs) == 1\nxs.append(2)\nassert {f}.__call__(xs) == 2\n"),
    "sees_what_the_tests_did_to_it": (("S = []\ndef f(xs=None):\n    global S\n    if xs is not None:\n        S = xs\n"
                                      "    return sum(S)\n"), "xs = [1]\n{f}(xs)\nxs.append(2)\nassert {f}() == 3\n"),
    "a_cycle": ("def f(n):\n    a = [n]\n    a.append(a)\n    return a\n", "a = {f}(1)\nassert a[1] is a and a[0] == 1\n"),
}


def test_what_the_tests_observe_is_the_program():
    """Class 4 (objects): identity and aliasing cross with the values, an argument the program
    changes comes back changed, and a container the program keeps stays in step both ways, so each
    buggy program fails exactly as it would in one process, and each honest one passes."""
    statuses = _status(_judge({**OBSERVED, **HONEST_OBSERVED}, "f", 'def f(x):\n    """f."""\n'))
    assert statuses == {**{n: "failed" for n in OBSERVED}, **{n: "passed" for n in HONEST_OBSERVED}}


INTROSPECTED = {  # tests that look at the function rather than call it, or change the world it runs in
    "getsource": "import inspect\nassert 'sorted' not in inspect.getsource({f})\nassert {f}([2, 1]) == [1, 2]\n",
    "code_object": "assert {f}.__code__.co_argcount == 1\n",
    "signature": "import inspect\nassert len(inspect.signature({f}).parameters) == 1\n",
    "settrace_counts_calls": ("import sys\ncalls = []\nsys.settrace(lambda fr, ev, arg: calls.append(fr.f_code.co_name))\n"
                              "{f}([2, 1])\nsys.settrace(None)\nassert calls.count('f') <= 1\n"),
    "mock_patch_builtin": "from unittest import mock\nwith mock.patch('builtins.sorted', side_effect=AssertionError):\n"
                          "    assert {f}([2, 1]) == [1, 2]\n",
    "mock_patch_module": "import math\nfrom unittest import mock\nwith mock.patch.object(math, 'sqrt', lambda x: 0):\n"
                         "    assert {f}([2, 1]) == [1, 2]\n",
    "builtins_replaced_by_hand": "import builtins\nsaved = builtins.sorted\nbuiltins.sorted = None\ntry:\n"
                                 "    assert {f}([2, 1]) == [1, 2]\nfinally:\n    builtins.sorted = saved\n",
    "stdin_replaced": "import io, sys\nsys.stdin = io.StringIO('2 1')\nassert {f}([2, 1]) == [1, 2]\n",
}


def test_tests_that_observe_the_function_itself_are_unsupported():
    """Class 4 (the function): its source, code object and signature, a trace of its frames, a
    rebinding of its name, a patch or a replaced builtin or stdin while it runs, all live in the
    program's process: unsupported, for the forger (sorted inside) and the honest program alike."""
    forger = "def f(xs):\n    return sorted(xs)\n"
    honest = "def f(xs):\n    out = list(xs)\n    for i in range(len(out)):\n        for j in range(len(out) - 1 - i):\n" \
             "            if out[j] > out[j + 1]:\n                out[j], out[j + 1] = out[j + 1], out[j]\n    return out\n"
    cases = {f"{who}_{n}": (prog, body) for n, body in INTROSPECTED.items()
             for who, prog in (("forger", forger), ("honest", honest))}
    results = _judge(cases, "f", 'def f(xs: list) -> list:\n    """Sorted."""\n')
    assert set(_status(results).values()) == {"unsupported"}, _status(results)
    # a counter rebound over the program's name, as a one-process harness would count its recursion:
    # with f as the entry point it is the program's and the rebinding is seen; without, the tests
    # define f themselves and it is never the program's
    rebind = "calls = [0]\ninner = f\ndef f(xs):\n    calls[0] += 1\n    return inner(xs)\nassert inner([2, 1]) == [1, 2]\n"
    rebound = run_many([Job(p, rebind, ep) for p in (forger, honest) for ep in ("f", "")], TIMEOUT, workers=2)
    assert [(r.status, r.exception) for r in rebound] == [("unsupported", ""), ("error", "NameError")] * 2, rebound
    assert "__wrapped__" in results["forger_getsource"][0].message
    assert "sys.settrace" in results["forger_settrace_counts_calls"][0].message


CARRIED = {  # what the tests set up for the call, carried to the program's process: honest programs pass
    "deep_recursion_allowed": ("def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n",
                               "import sys\nsys.setrecursionlimit(20000)\nassert {f}(5000) == 5000\n"),
    "printed_output_captured": ("def f(n):\n    print('n is', n)\n",
                                ("import contextlib, io\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n"
                                "    {f}(3)\nassert buf.getvalue() == 'n is 3\\n'\n")),
    "stdout_patched_by_mock": ("def f(n):\n    print(n)\n", ("import io\nfrom unittest import mock\n"
                               "with mock.patch('sys.stdout', new_callable=io.StringIO) as out:\n    {f}(4)\n"
                               "assert out.getvalue() == '4\\n'\n")),
}


def test_the_tests_recursion_limit_and_output_capture_reach_the_program():
    """Class 4 (the world): sys.setrecursionlimit set by the tests bounds the call both ways (a
    recursion 500 deep fails under a limit of 100, as in one process), and a call's printed output
    reaches a test that redirects stdout to read it."""
    cases = {**CARRIED, "recursion_too_deep": (CARRIED["deep_recursion_allowed"][0],
                                                "import sys\nsys.setrecursionlimit(100)\nassert {f}(500) == 500\n")}
    results = _judge(cases, "f", 'def f(n: int) -> int:\n    """f."""\n')
    assert _status(results) == {**{n: "passed" for n in CARRIED}, "recursion_too_deep": "error"}, results
    assert {r.exception for r in results["recursion_too_deep"]} == {"RecursionError"}


HONEST_VALUES = {  # (program, tests): values an honest program returns or is given, in both directions
    "empty_bytes": ("def f(x):\n    return b'' if x == b'' else x\n", "assert {f}(b'') == b''\nassert {f}(b'ab') == b'ab'\n"),
    "counter": ("from collections import Counter\ndef f(s):\n    return Counter(s)\n",
                "c = {f}('aab')\nassert c == {'a': 2, 'b': 1} and c['z'] == 0 and c.most_common(1) == [('a', 2)]\n"),
    "defaultdict": (("from collections import defaultdict\ndef f(pairs):\n    d = defaultdict(list)\n"
                    "    for k, v in pairs:\n        d[k].append(v)\n    return d\n"),
                    "d = {f}([('a', 1), ('a', 2)])\nassert d == {'a': [1, 2]} and d['new'] == []\n"),
    "namedtuple": (("from collections import namedtuple\nPoint = namedtuple('Point', 'x y')\ndef f(a, b):\n"
                   "    return Point(a, b)\n"), "p = {f}(1, 2)\nassert p == (1, 2) and p.x == 1 and p._fields == ('x', 'y')\n"),
    "ordered_dict_and_deque": (("from collections import OrderedDict, deque\ndef f(n):\n"
                               "    o = OrderedDict((i, i) for i in range(n))\n    o.move_to_end(0)\n"
                               "    return o, deque(range(n), maxlen=2)\n"),
                               ("from collections import OrderedDict, deque\no, q = {f}(3)\n"
                               "assert o == OrderedDict([(1, 1), (2, 2), (0, 0)]) and o != OrderedDict([(0, 0), (1, 1), (2, 2)])\n"
                               "assert q == deque([1, 2]) and q.maxlen == 2\n")),
    "numbers": (("from fractions import Fraction\nfrom decimal import Decimal\ndef f(n):\n"
                "    return Fraction(1, n), Decimal('0.1') * n, complex(n, -n), range(n), 2 ** 100 * n\n"),
                ("from fractions import Fraction\nfrom decimal import Decimal\n"
                "assert {f}(3) == (Fraction(1, 3), Decimal('0.3'), 3 - 3j, range(3), 3 * 2 ** 100)\n")),
    "an_iterator": ("def f(xs):\n    return map(str, xs)\n", "assert list({f}([1, 2])) == ['1', '2']\n"),
    "given_a_counter_and_a_namedtuple": ("def f(c, p):\n    return c['a'] + p[0]\n",
                                         ("from collections import Counter, namedtuple\n"
                                         "assert {f}(Counter('aa'), namedtuple('P', 'x')(1)) == 3\n")),
    "bytearray_changed_in_place": ("def f(b):\n    b[0] = 0\n", "b = bytearray(b'xy')\n{f}(b)\nassert b == bytearray(b'\\x00y')\n"),
}
CANNOT_CROSS = {  # honest, but no plain data: unsupported, never forged
    "a_date": ("import datetime\ndef f(n):\n    return datetime.date(2020, 1, n)\n", "assert {f}(1).day == 1\n"),
    "defaultdict_of_a_lambda": ("from collections import defaultdict\ndef f(n):\n    return defaultdict(lambda: n)\n",
                                "assert {f}(1)['x'] == 1\n"),
    "given_a_date": ("def f(d):\n    return d.day\n", "import datetime\nassert {f}(datetime.date(2020, 1, 1)) == 1\n"),
}


def test_honest_values_cross_and_the_rest_are_unsupported_never_forged():
    """Class 6: b"" either way, Counter, defaultdict, namedtuple, OrderedDict, deque, Fraction,
    Decimal, complex, range, big ints, an iterator's items, a bytearray changed in place. What
    cannot cross is unsupported, whichever way it goes."""
    statuses = _status(_judge({**HONEST_VALUES, **CANNOT_CROSS}, "f", 'def f(x):\n    """f."""\n'))
    assert statuses == {**{n: "passed" for n in HONEST_VALUES}, **{n: "unsupported" for n in CANNOT_CROSS}}


def _frame(frame: str) -> str:
    """A program whose f() answers `frame` on the channel itself, its own answer never sent."""
    return ("import gc, os\nSRV = next(o for o in gc.get_objects() if type(o).__name__ == 'Server')\n"
            f"def f(xs):\n    os.write(SRV.send_fd, {frame.encode()!r})\n    os._exit(0)\n")


FORGED_STATE = {  # answers that claim objects or changes the program never had
    "a_reference_to_nothing": '{"ok": ["r", 7], "sync": [], "held": []}\n',
    "a_change_to_a_container_never_held": '{"ok": 1, "sync": [[7, ["l", [1]]]], "held": []}\n',
    "a_change_of_type": '{"ok": 1, "sync": [[0, ["d", []]]], "held": []}\n',
    "held_what_it_never_had": '{"ok": 1, "sync": [], "held": [5]}\n',
    "no_held_list": '{"ok": 1, "sync": []}\n',
    "an_exception_of_no_builtin_base": ('{"raise": {"type": "E", "base": "print", "message": "", "args": null, '
                                        '"traceback": ""}, "sync": [], "held": []}\n'),
    "a_deque_whose_maxlen_changes": '{"ok": 1, "sync": [[0, ["q", [3, []]]]], "held": []}\n',
}


def test_forged_identity_and_changes_are_forged_output():
    """The references and changes the channel now carries can only name containers the program was
    given or holds, with their own type: anything else is a forgery (and what is well formed is
    something a program could have done, judged as such)."""
    tests = "xs = [3, 1]\nassert {f}(xs) == 1\n"
    results = _judge({n: (_frame(frame), tests) for n, frame in FORGED_STATE.items()}
                     | {"a_well_formed_change": (_frame('{"ok": 1, "sync": [[0, ["l", [1]]]], "held": []}\n'),
                                                 tests + "assert xs == [1]\n")}, "f", 'def f(xs):\n    """f."""\n')
    assert _status(results) == {**{n: "forged_output" for n in FORGED_STATE}, "a_well_formed_change": "passed"}


SENDER = r'''
import ctypes, fcntl, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
SHARED = sys.base_prefix + "/lib/python%d.%d/os.py" % sys.version_info[:2]
held = [open(SHARED, "rb"), open(SHARED.replace("os.py", "abc.py"), "rb")]  # closing os.py drops its POSIX locks
fcntl.flock(held[0], fcntl.LOCK_EX)
fcntl.lockf(held[1], fcntl.LOCK_SH)
libc.syscall(KEYS["add_key"], b"user", b"mf-covert", b"1", 1, ctypes.c_int(-4))  # the user keyring
libc.syscall(KEYS["add_key"], b"user", b"mf-covert", b"1", 1, ctypes.c_int(-3))  # the session keyring
for _ in range(20):  # per-uid process count: a sibling as the same uid would see these
    if os.fork() == 0:
        time.sleep(5)
        os._exit(0)
for _ in range(30):
    os.close(os.open(SHARED, os.O_RDONLY))  # what an inotify watch on the shared file would see
    time.sleep(0.1)
def f():
    return "sent"
'''
RECEIVER = r'''
import ctypes, fcntl, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
SHARED = sys.base_prefix + "/lib/python%d.%d/os.py" % sys.version_info[:2]
time.sleep(1.0)
heard = []
f1 = open(SHARED, "rb")
try:
    fcntl.flock(f1, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    heard.append("flock")
f2 = open(SHARED.replace("os.py", "abc.py"), "rb")
lk = fcntl.fcntl(f2, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
if struct.unpack("hhqqi", lk)[0] != fcntl.F_UNLCK:
    heard.append("posix lock")
if open("/proc/locks").read().strip():
    heard.append("/proc/locks")
for ring in (-4, -3, -5):
    if libc.syscall(KEYS["keyctl"], 10, ctypes.c_int(ring), b"user", b"mf-covert", 0) > 0:
        heard.append(f"keyring {ring}")
fd = libc.inotify_init1(os.O_NONBLOCK)
if fd >= 0 and libc.inotify_add_watch(fd, SHARED.encode(), 0x20) >= 0:
    time.sleep(0.5)
    try:
        os.read(fd, 4096)
        heard.append("inotify")
    except BlockingIOError:
        pass
pids = []
try:
    for _ in range(60):
        pid = os.fork()
        if pid == 0:
            time.sleep(2)
            os._exit(0)
        pids.append(pid)
except OSError:
    heard.append(f"process count ({len(pids)} forks)")
def f():
    return heard
'''
KEYS = {"x86_64": {"add_key": 248, "keyctl": 250}, "aarch64": {"add_key": 217, "keyctl": 219}}


def test_sandboxes_side_by_side_cannot_signal_each_other():
    """Class 5: one program holds a lock on a file every sandbox shows (flock, a POSIX lock), puts a
    key in the user and session keyrings, keeps 20 processes alive and opens the shared file again
    and again; another, running at the same time, listens for each. It hears nothing: locks are
    no-ops, keyrings and inotify are refused (seccomp.py), and each sandbox runs as a uid of its own.
    The honest control: a program that locks its own file (sqlite on /tmp) works."""
    keys = f"KEYS = {KEYS[os.uname().machine]!r}\n"
    sqlite = ("import sqlite3, tempfile\ndef f():\n    db = sqlite3.connect(tempfile.mkdtemp() + '/db')\n"
              "    db.execute('create table t (a)')\n    db.execute('insert into t values (1)')\n    db.commit()\n"
              "    return db.execute('select a from t').fetchall()[0][0]\n")
    results = run_many([Job(keys + SENDER, "assert f() == 'sent'\n"), Job(keys + RECEIVER, "heard = f()\nassert heard == [], heard\n"),
                        Job(sqlite, "assert f() == 1\n")], 15.0, workers=2)
    assert [r.status for r in results] == ["passed", "passed", "passed"], results
