"""The wheel a user installs holds every module and every file the code reads: pyproject lists the
packages by hand (kernels/ is installed as mentor_fast.kernels), so a new package folder must be
added there; this builds the wheel from a copy of the tree and compares."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tree_files() -> set[str]:
    """Every module and data file of the installed package, as the wheel names them."""
    out = set()
    for folder, prefix in (("mentor_fast", "mentor_fast"), ("kernels", "mentor_fast/kernels")):
        for p in (ROOT / folder).rglob("*"):
            if p.is_file() and p.suffix in (".py", ".txt") and "__pycache__" not in p.parts:
                out.add(f"{prefix}/{p.relative_to(ROOT / folder).as_posix()}")
    return out


def test_the_wheel_holds_every_module_and_prompt(tmp_path):
    src = tmp_path / "src"
    for name in ("mentor_fast", "kernels"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    [wheel] = (tmp_path / "dist").glob("mentor_fast-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_tree_files() - names)
    assert missing == [], f"not in the wheel (pyproject's packages or package-data): {missing}"
