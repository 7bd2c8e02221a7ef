"""The package runs on Python 3.10 (pyproject's requires-python), not only on the 3.11 we test with.

vermin reads every module and names the oldest Python each construct needs; 3.11-only names
(enum.StrEnum, typing.Self) come through mentor_fast/compat.py, whose 3.11 branch is marked.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from conftest import REPO


def _vermin() -> list[str]:
    exe = shutil.which("vermin", path=str(REPO / ".venv" / "bin")) or shutil.which("vermin")
    assert exe, "vermin is a dev dependency (pip install -e '.[dev]')"
    return [exe, "-q", "--no-tips", "--eval-annotations", "-t=3.10-"]


def test_every_module_runs_on_the_oldest_python_pyproject_names():
    assert re.search(r'^requires-python = ">=3.10"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    out = subprocess.run([*_vermin(), "mentor_fast", "kernels"], cwd=REPO, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_check_catches_a_3_11_only_import(tmp_path):
    bad = tmp_path / "uses_strenum.py"
    bad.write_text("from enum import StrEnum\n\nclass K(StrEnum):\n    A = 'a'\n")
    out = subprocess.run([*_vermin(), str(bad)], capture_output=True, text=True, check=False)
    assert out.returncode != 0


def test_compat_strenum_members_are_their_values():
    from mentor_fast.compat import StrEnum

    class Kind(StrEnum):
        A = "a"

    assert Kind.A == "a" and str(Kind.A) == "a" and f"{Kind.A}" == "a" and Kind("a") is Kind.A
    assert sys.version_info < (3, 11) or StrEnum.__module__ == "enum"
