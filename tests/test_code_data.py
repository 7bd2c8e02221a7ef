"""Code ladder (determinism, levels, held-out split, references pass and wrong programs fail in the
sandbox), code JSONL layouts (default, MBPP, APPS call-based and stdio, HumanEval), bad rows, and
turning a completion into the program the sandbox runs."""

from __future__ import annotations

import json
import re

import pytest

from mentor_fast.config import DataConfig
from mentor_fast.data import CodeJsonlSource, CodeLadder, DataError, build_source, load_code_jsonl
from mentor_fast.data.code_ladder import LEVELS, is_held_out
from mentor_fast.rewards.code import run_many, run_tests
from mentor_fast.rewards.program import assemble_program, extract_code
from mentor_fast.types import CodeTask

ALL = list(LEVELS)


def _stub(name: str, value: str) -> str:
    return f"def {name}(*args, **kwargs):\n    return {value}\n"


# -- the code ladder ------------------------------------------------------------------------------


def test_ladder_is_deterministic_per_seed_and_differs_across_seeds():
    cfg = DataConfig(source="code_ladder", levels=ALL)
    a, b, c = CodeLadder(cfg, seed=7), CodeLadder(cfg, seed=7), CodeLadder(cfg, seed=8)
    batch = a.batch(3, 16)
    assert batch == b.batch(3, 16)
    assert [p.code for p in batch] == [p.code for p in b.batch(3, 16)]  # tests included
    assert [p.id for p in batch] == [f"code-L{p.level}-7-{48 + i}" for i, p in enumerate(batch)]
    assert {p.source for p in batch} == {"code_ladder"}
    assert [p.code.tests for p in batch] != [p.code.tests for p in c.batch(3, 16)]
    assert batch != a.batch(4, 16)
    resumed = CodeLadder(cfg, seed=7)  # a restart at step 3: no iterator state
    assert resumed.batch(3, 16) == batch
    assert isinstance(build_source(cfg, 7), CodeLadder)


def test_levels_and_the_jump():
    cfg = DataConfig(source="code_ladder", levels=[1, 2], jump_step=5, jump_levels=[6, 7])
    ladder = CodeLadder(cfg, seed=0)
    assert ladder.used_levels() == [1, 2, 6, 7]
    assert ladder.levels_at(4) == [1, 2] and ladder.levels_at(5) == [6, 7]
    assert {p.level for p in ladder.batch(4, 32)} == {1, 2}
    assert {p.level for p in ladder.batch(5, 32)} == {6, 7}
    with pytest.raises(ValueError, match="levels"):
        CodeLadder(DataConfig(source="code_ladder", levels=[8]), 0)


def test_every_problem_is_well_formed():
    ladder = CodeLadder(DataConfig(source="code_ladder", levels=ALL), seed=1)
    for p in ladder.batch(0, 280):
        code = p.code
        assert code is not None and code.style == "function" and code.prompt == ""
        assert f"`{code.entry_point}(" in p.question and " -> " in p.question  # the exact signature
        assert p.gold == code.solution and code.solution.startswith(f"def {code.entry_point}(")
        assert 5 <= code.tests.count("assert ") <= 8
        assert len(p.solution_steps) == len(code.step_markers) >= 1
        for step in p.solution_steps:  # words, not code
            assert not re.search(r"[()`=_\[\]{}]", step), (p.id, step)
        for marker in code.step_markers:  # the reference has every step it describes
            assert re.search(marker, code.solution), (p.id, marker, code.solution)


def test_held_out_problems_are_disjoint_from_training():
    cfg = DataConfig(source="code_ladder", levels=ALL, eval_size=70)
    ladder = CodeLadder(cfg, seed=3)
    train = {p.question for step in range(40) for p in ladder.batch(step, 50)}
    held = ladder.eval_problems()
    assert len(held) == 70 and len({p.question for p in held}) == 70
    assert [p.level for p in held[:7]] == ALL  # round robin over the levels used
    assert all(is_held_out(p.question) for p in held) and not any(map(is_held_out, train))
    assert not train & {p.question for p in held}
    assert held == CodeLadder(cfg, seed=3).eval_problems()
    assert len(ladder.eval_problems(64, levels=[6])) == 64  # a jump level alone has enough questions


def test_references_pass_and_trivially_wrong_programs_fail_in_the_sandbox():
    ladder = CodeLadder(DataConfig(source="code_ladder"), seed=11)
    problems = [ladder.train_problem(i, level) for level in LEVELS for i in range(3)]
    jobs = []
    for p in problems:
        jobs += [(p.code.solution, p.code.tests), (_stub(p.code.entry_point, "None"), p.code.tests),
                 (_stub(p.code.entry_point, "0"), p.code.tests)]
    results = run_many(jobs, 10, workers=2)
    for k, p in enumerate(problems):
        ref, none, zero = results[3 * k : 3 * k + 3]
        assert ref.passed, (p.id, ref.status, ref.message, ref.test_line, p.code.solution, p.code.tests)
        assert none.status == "failed" and zero.status == "failed", (p.id, none.test_line, zero.test_line)


def _first(level: int, pattern: str, seed: int = 0):
    ladder = CodeLadder(DataConfig(source="code_ladder", levels=[level]), seed)
    return next(p for p in ladder.batch(0, 200) if re.search(pattern, p.question))


def _first_missing_step(program: str, markers: tuple[str, ...]) -> int | None:
    return next((i for i, m in enumerate(markers) if not re.search(m, program, re.MULTILINE)), None)


def test_the_natural_attempts_at_the_jump_fail_a_specific_test_and_lack_the_key_step():
    distinct = _first(6, r"second-largest distinct")
    weight = _first(7, r"(weight|heft|worth|mass) of a word")
    k1, k2 = map(int, re.findall(r"has \w+ (\d)", weight.question)[:2])  # a vowel's, another letter's
    naive_distinct = (f"def {distinct.code.entry_point}(xs):\n"
                      "    return sorted(xs)[-2] if len(xs) > 1 else None\n")
    naive_weight = (f"def {weight.code.entry_point}(s):\n"
                    f"    return sum({k1} if c in 'aeiouAEIOU' else {k2} for c in s if c.strip())\n")
    naive = [(naive_distinct, distinct.code.tests), (naive_weight, weight.code.tests)]
    for (program, tests), result in zip(naive, run_many(naive, 10, workers=2), strict=True):
        assert result.status == "failed", (result.status, result.message)
        assert result.test_line.startswith("assert ") and result.test_line in tests
    # what the reference mentor would name: dropping repeats; leaving out what is not a letter
    assert _first_missing_step(naive_distinct, distinct.code.step_markers) == 0
    assert _first_missing_step(naive_weight, weight.code.step_markers) == 2


# -- extraction and assembly ------------------------------------------------------------------------


def test_extract_code_takes_the_last_python_block():
    text = ("Plan first.\n```python\ndef f():\n    return 1\n```\n"
            "Better:\n```py\ndef f():\n    return 2\n```\n"
            "Output:\n```text\n2\n```\n")
    assert extract_code(text) == "def f():\n    return 2\n"
    assert extract_code("```\nx = 1\n```\nthen\n```python3\ny = 2\n```") == "y = 2\n"


def test_extract_code_unterminated_fence_no_fence_and_leftovers():
    assert extract_code("Sure:\n```python\ndef g(x):\n    return x\n") == "def g(x):\n    return x\n"
    assert extract_code("def h():\n    return 3\n") == "def h():\n    return 3\n"
    assert extract_code("    return a + b\n```\n") == "    return a + b\n"  # a continuation's stray close
    assert extract_code("```python\nz = 0```") == "z = 0\n"
    assert extract_code("") is None and extract_code("  \n\t\n") is None
    assert extract_code("```python\n```") is None


HE_PROMPT = '''import math


def encode_cyclic(s: str):
    """returns encoded string by cycling groups of three characters."""
    groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]
    groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]
    return "".join(groups)


def decode_cyclic(s: str):
    """takes as input string encoded with encode_cyclic function. Returns decoded string."""
'''
HE_TESTS = ("def check(candidate):\n    for s in ['', 'ab', 'abcdefg', 'hello world']:\n"
            "        assert candidate(encode_cyclic(s)) == s\n    assert math.pi > 3\n"
            "\ncheck(decode_cyclic)\n")
HE_TASK = CodeTask(HE_TESTS, "decode_cyclic", prompt=HE_PROMPT)


def test_assembly_onto_a_humaneval_prompt_with_a_helper():
    body = "    return encode_cyclic(encode_cyclic(s))\n"
    full = f"Here it is:\n```python\ndef decode_cyclic(s: str):\n{body}```"
    continued, whole = assemble_program(body, HE_TASK), assemble_program(full, HE_TASK)
    assert continued == HE_PROMPT + body
    assert whole.count("def decode_cyclic") == 1 and "def encode_cyclic" in whole and "import math" in whole
    assert whole.endswith("def decode_cyclic(s: str):\n    return encode_cyclic(encode_cyclic(s))\n")
    wrong = assemble_program("```python\ndef decode_cyclic(s: str):\n    return s\n```", HE_TASK)
    results = run_many([(continued, HE_TESTS), (whole, HE_TESTS), (wrong, HE_TESTS)], 10, workers=2)
    assert [r.status for r in results] == ["passed", "passed", "failed"]
    assert assemble_program("no code here? ", CodeTask("", "f")) == "no code here?\n"
    assert assemble_program("   ", HE_TASK) is None


# -- code JSONL -------------------------------------------------------------------------------------


def _write(tmp_path, name: str, rows: list) -> str:
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_default_layout(tmp_path):
    row = {"prompt": "Write `inc(x: int) -> int` returning x + 1.", "entry_point": "inc",
           "tests": "assert inc(1) == 2\nassert inc(-1) == 0\n",
           "reference": "def inc(x):\n    return x + 1\n", "difficulty": "easy"}
    path = _write(tmp_path, "mine.jsonl", [row, {**row, "reference": None}])
    (p, q), report = load_code_jsonl(path)
    assert (p.id, p.source, p.question, p.gold) == ("mine-1", f"{path}:1", row["prompt"], row["reference"])
    assert p.code == CodeTask(row["tests"], "inc", solution=row["reference"])
    assert p.columns == {"difficulty": "easy"}
    assert q.gold == "" and report.loaded == 2
    assert run_tests(p.code.solution, p.code.tests, 10).passed


MBPP_ROW = {
    "task_id": 2, "text": "Write a function to find the shared elements from the given two lists.",
    "code": "def similar_elements(a, b):\n  return tuple(set(a) & set(b))",
    "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
                  "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))"],
    "test_setup_code": "import math", "challenge_test_list": [],
}


def test_mbpp_layout_finds_the_entry_point_and_shows_one_test(tmp_path):
    path = _write(tmp_path, "mbpp.jsonl", [MBPP_ROW])
    (p,), _ = load_code_jsonl(path, "mbpp")
    assert p.code.entry_point == "similar_elements"  # not `set`, the builtin around it
    assert p.question.startswith(MBPP_ROW["text"]) and MBPP_ROW["test_list"][0] in p.question
    assert p.code.tests.startswith("import math\n") and p.code.tests.count("assert ") == 2
    assert p.columns == {"task_id": 2, "challenge_test_list": []}
    wrong = "def similar_elements(a, b):\n  return tuple(a)"
    results = run_many([(p.gold, p.code.tests), (wrong, p.code.tests)], 10, workers=2)
    assert [r.status for r in results] == ["passed", "failed"]


def test_apps_call_based_and_stdio_rows(tmp_path):
    cases = {"fn_name": "count_odd", "inputs": [[[1, 2, 3]], [[]]], "outputs": [[2], [0]]}
    call = {"question": "Return the number of odd values.", "starter_code": "def count_odd(xs):\n",
            "input_output": json.dumps(cases),
            "solutions": json.dumps(["def count_odd(xs):\n    return sum(x % 2 for x in xs)\n"])}
    stdio = {"question": "Read n and then n numbers; print their sum and their maximum.",
             "input_output": {"inputs": ["3\n1 5 2\n", "1\n-4\n"], "outputs": ["8 5\n", "-4  -4"]},
             "solutions": [("n = int(input())\nxs = list(map(int, input().split()))\n"
                           "print(sum(xs), max(xs))\n")]}
    path = _write(tmp_path, "apps.jsonl", [call, stdio])
    (c, s), _ = load_code_jsonl(path, "apps")
    assert c.code.style == "function" and c.code.entry_point == "count_odd"
    assert "def count_odd(xs)" in c.question
    assert s.code.style == "stdio" and s.code.entry_point == "" and "standard input" in s.question
    buffered = ("import sys\ndata = sys.stdin.buffer.read().split()\nxs = list(map(int, data[1:]))\n"
                "sys.stdout.write(f'{sum(xs)} {max(xs)}\\n')\nexit()\n")
    jobs = [(assemble_program(c.gold, c.code), c.code.tests),
            (assemble_program("def count_odd(xs):\n    return len(xs)\n", c.code), c.code.tests),
            (assemble_program(f"```python\n{s.gold}```", s.code), s.code.tests),
            (assemble_program(buffered, s.code), s.code.tests),
            (assemble_program("print(sum(map(int, input().split())))", s.code), s.code.tests)]
    assert jobs[2][0].startswith("SOURCE = ")
    results = run_many(jobs, 10, workers=2)
    assert [r.status for r in results] == ["passed", "failed", "passed", "passed", "failed"], results
    assert "expected" in results[4].message and "case 0" in results[4].message


def test_humaneval_layout(tmp_path):
    row = {"task_id": "X/0", "prompt": HE_PROMPT, "entry_point": "decode_cyclic",
           "canonical_solution": "    return encode_cyclic(encode_cyclic(s))\n",
           "test": HE_TESTS.rsplit("check(", 1)[0]}
    (p,), _ = load_code_jsonl(_write(tmp_path, "he.jsonl", [row]), "humaneval")
    assert p.code.prompt == HE_PROMPT and p.code.tests.endswith("\ncheck(decode_cyclic)\n")
    assert "```python\n" + HE_PROMPT.strip("\n") + "\n```" in p.question and p.columns == {"task_id": "X/0"}
    assert run_tests(p.gold, p.code.tests, 10).passed


def test_bad_rows_name_file_and_line(tmp_path):
    good = {"prompt": "q", "tests": "assert f() == 1", "entry_point": "f"}
    path = _write(tmp_path, "bad.jsonl", [good, {"prompt": "q", "entry_point": "f"}, {**good, "tests": 3},
                                          "{not json", {**good, "entry_point": ""}])
    with pytest.raises(DataError, match=re.escape(f"{path}:2: missing column 'tests'")):
        load_code_jsonl(path)
    problems, report = load_code_jsonl(path, on_bad_row="skip")
    assert [p.id for p in problems] == ["bad-1"] and report.rows == 5
    assert dict(report.skipped) == {"missing_column": 1, "bad_column": 2, "invalid_json": 1}
    assert report.examples[1].startswith(f"{path}:3: column 'tests' must be a string, got int")
    mbpp_bad = _write(tmp_path, "m.jsonl", [{**MBPP_ROW, "test_list": "assert f(1) == 2"}])
    with pytest.raises(DataError, match=r"m\.jsonl:1: column 'test_list' must be a non-empty list"):
        load_code_jsonl(mbpp_bad, "mbpp")
    apps_bad = _write(tmp_path, "a.jsonl", [{"question": "q", "input_output": "{\"inputs\": [1]"}])
    with pytest.raises(DataError, match=r"a\.jsonl:1: column 'input_output': invalid JSON"):
        load_code_jsonl(apps_bad, "apps")
    with pytest.raises(DataError, match="unknown code column layout"):
        load_code_jsonl(path, "nope")


def test_code_jsonl_source_permutes_like_jsonl(tmp_path):
    rows = [{"prompt": f"q{i}", "tests": f"assert f() == {i}", "entry_point": "f"} for i in range(5)]
    cfg = DataConfig(source="jsonl", format="code", path=_write(tmp_path, "five.jsonl", rows), eval_size=2)
    source = build_source(cfg, seed=4)
    assert isinstance(source, CodeJsonlSource)
    epoch = source.batch(0, 5)
    assert sorted(p.question for p in epoch) == [f"q{i}" for i in range(5)]
    assert source.batch(1, 3) == build_source(cfg, seed=4).batch(1, 3)
    assert len(source.eval_problems()) == 2 and len(source.eval_problems(0)) == 5
