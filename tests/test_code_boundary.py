"""The boundary between the trainer and the processes that judge a program (mentor_fast/rewards/inside/).

What runs in the program's sandbox and in its checker imports the standard library and its own
package only, and the host ships exactly that package into them: read from the source (every
import statement, at any depth) and seen at run time (the blob loaded in a bare `python -I -S`).
"""

from __future__ import annotations

import ast
import json
import marshal
import subprocess
import sys
from pathlib import Path

from mentor_fast.rewards import inside, judge, sandbox

INSIDE = Path(inside.__file__).resolve().parent
PACKAGE = inside.__name__
MODULES = sorted(p.stem for p in INSIDE.glob("*.py") if p.stem != "__init__")


def foreign_imports(source: str, siblings: list[str]) -> list[str]:
    """The imports in `source` that are neither the standard library nor a module of the inside package,
    as 'line: statement'."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # the loader makes modules without a package spec: relative imports cannot resolve
                bad.append(f"{node.lineno}: relative import")
                continue
            names = ([f"{node.module}.{a.name}" for a in node.names] if node.module == PACKAGE else [node.module])
        else:
            continue
        for name in names:
            stdlib = name.split(".")[0] in sys.stdlib_module_names
            sibling = name.startswith(PACKAGE + ".") and name[len(PACKAGE) + 1:].split(".")[0] in siblings
            if not (stdlib or sibling):
                bad.append(f"{node.lineno}: {name}")
    return bad


def test_every_inside_module_imports_only_the_standard_library_and_its_siblings():
    assert {"wire", "decoder", "channel", "checker", "runner", "isolate", "seccomp"} <= set(MODULES)
    for path in sorted(INSIDE.glob("*.py")):
        assert foreign_imports(path.read_text(), MODULES) == [], path


def test_the_import_check_catches_what_would_cross_the_boundary():
    source = ("import os, json\nfrom collections import deque\nfrom mentor_fast.rewards.inside import wire\n"
              "def f():\n    import numpy\n    from mentor_fast.rewards import sandbox\n"
              "    from mentor_fast.rewards.inside import nosuch\n    from mentor_fast.rewards.inside.wire import Table\n"
              "    from . import wire\n    from mentor_fast.types import Problem\n")
    assert foreign_imports(source, MODULES) == [
        "5: numpy", "6: mentor_fast.rewards", "7: mentor_fast.rewards.inside.nosuch", "9: relative import",
        "10: mentor_fast.types"]


def test_the_sandbox_and_the_checker_are_shipped_exactly_the_inside_package():
    shipped = set(sandbox.RUNNER_MODULES) | set(judge.CHECKER_MODULES)
    assert shipped == set(MODULES)
    for names in (sandbox.RUNNER_MODULES, judge.CHECKER_MODULES):
        codes = marshal.loads(sandbox.code_blob(names)[8:])
        assert [n for n, _ in codes] == list(names)
        assert [Path(c.co_filename) for _, c in codes] == [INSIDE / f"{n}.py" for n in names]


def test_the_shipped_modules_load_in_a_bare_interpreter_and_bring_in_nothing_else():
    # Each process's modules, loaded by the LOADER it boots with, in `python -I -S` with an empty
    # environment and / as its directory (no site-packages, no checkout on the path), as the zygote
    # and the sandbox start; the modules they import while loading must all be the standard library's.
    report = "import json\nprint(json.dumps(sorted(set(sys.modules) - _before)))\n"
    for names in (sandbox.RUNNER_MODULES, judge.CHECKER_MODULES):
        script = "import sys\n_before = set(sys.modules)\n" + sandbox.LOADER + report
        out = subprocess.run([sys.executable, "-I", "-S", "-c", script], input=sandbox.code_blob(names),
                             capture_output=True, env={}, cwd="/", check=False, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        loaded = json.loads(out.stdout)
        ours = {m for m in loaded if m.split(".")[0] == "mentor_fast"}
        assert ours == {"mentor_fast", "mentor_fast.rewards", PACKAGE, *(f"{PACKAGE}.{n}" for n in names)}
        assert [m for m in loaded if m not in ours and m.split(".")[0] not in sys.stdlib_module_names] == []
