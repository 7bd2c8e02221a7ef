"""The README's file map ("Where things are") names every module of the package and the kernels, under
its own folder, and nothing that does not exist: a file added, moved or removed without its line fails."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\b[\w]+\.(?:py|sh)\b")


def _map_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Where things are", 1)[1]
    return section.split("```", 2)[1].splitlines()[1:]


def mentioned_paths(lines: list[str]) -> set[str]:
    """Each file name in the map, joined to the folder it is listed under: a line's first token ending
    in "/" opens a folder (nested by indentation); names on a file's line, a folder's line, or a
    continuation line (no token of its own in the name column) belong to the folder they sit in."""
    stack: list[tuple[int, str]] = []  # (indent, folder)
    context = ""
    found = set()
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0]
        continuation = indent >= 20
        if not continuation:
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else ""
            if first.endswith("/"):
                stack.append((indent, parent + first))
                context = parent + first
            else:
                context = parent
        found |= {context + name for name in NAME.findall(line)}
    return found


def test_the_map_names_every_module_and_only_files_that_exist():
    found = mentioned_paths(_map_block())
    modules = {str(p.relative_to(ROOT)) for folder in ("mentor_fast", "kernels")
               for p in (ROOT / folder).rglob("*.py") if p.name != "__init__.py"}
    assert sorted(modules - found) == [], "modules the README's file map does not list"
    assert sorted(p for p in found if not (ROOT / p).is_file()) == [], "files in the map that do not exist"


def test_the_reader_places_names_under_their_folders():
    lines = ["pkg/", "  a.py    one", "  sub/", "    b.py  two; c.py: three", "    deeper/   d.py",
             "                      e.py continued", "  f.py    back up", "top/   g.sh"]
    assert mentioned_paths(lines) == {"pkg/a.py", "pkg/sub/b.py", "pkg/sub/c.py", "pkg/sub/deeper/d.py",
                                      "pkg/sub/deeper/e.py", "pkg/f.py", "top/g.sh"}
