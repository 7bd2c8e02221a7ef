"""The config reference page (docs/config.md), generated from the schema's dataclasses and the
docstring under each field; a test fails when the page is out of date.

    python -m mentor_fast.config.docs > docs/config.md
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import textwrap
import typing

from mentor_fast.config import schema
from mentor_fast.config.loader import ALIASES, REMOVED, RENAMED
from mentor_fast.kernels.settings import field_range

HEADER = """# Configuration reference

Generated from the schema (`mentor_fast/config/schema.py`, `config/recovery.py`, `config/mentor.py`,
`config/baselines.py` and `kernels/settings.py`) by `python -m mentor_fast.config.docs`; do not edit by hand
(`tests/test_config_docs.py` fails when this page and the schema disagree).

A run's configuration is one tree. YAML files (`--config`, later files win) set any subset of it,
and `key.sub=value` arguments come last: `mentor-fast train --config configs/demo_cpu.yaml
recovery.reroll.count=2`. An unknown key, a wrong type, a value outside its choices or a number
outside its range (shown after the type: `[a, b)` includes a, excludes b) stops the run before
anything loads, naming the key. The resolved tree is saved as `OUTPUT_DIR/config.yaml`.
"""


def _field_docs(cls: type) -> dict[str, str]:
    """{field: the string literal right after its annotation} from the class source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:] + [None]):
        field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if field and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                and isinstance(nxt.value.value, str):
            docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def _type_name(tp) -> str:
    tp, rng = field_range(tp)
    name = _bare_type_name(tp)
    return f"{name}, {rng}" if rng is not None else name


def _bare_type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " \\| ".join(f"`{e.value}`" for e in tp)
    if origin is list:
        return f"list[{_bare_type_name(typing.get_args(tp)[0])}]"
    return getattr(tp, "__name__", str(tp))


def _default(value) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return f'`"{value}"`' if len(value) < 40 else f'`"{value[:37]}..."`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _sections(cls: type, prefix: str):
    """(dotted section name, its dataclass) for `cls` and every nested config, depth first."""
    yield prefix, cls
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _sections(hints[f.name], f"{prefix}.{f.name}" if prefix else f.name)


def _star(key: str) -> str:
    """".*" after a section's name (every key under it), nothing after a key's."""
    section = schema.RunConfig()
    for name in key.split("."):
        section = getattr(section, name)
    return ".*" if dataclasses.is_dataclass(section) else ""


def render() -> str:
    out = [HEADER]
    for name, cls in _sections(schema.RunConfig, ""):
        hints, docs, instance = typing.get_type_hints(cls, include_extras=True), _field_docs(cls), cls()
        rows = []
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                continue
            key = f"{name}.{f.name}" if name else f.name
            doc = docs.get(f.name, "").replace("|", "\\|")
            rows.append(f"| `{key}` | {_type_name(hints[f.name])} | {_default(getattr(instance, f.name))} | {doc} |")
        out.append(f"\n## `{name}`\n" if name else "\n## Top level\n")
        if cls.__doc__ and name and not cls.__doc__.startswith(cls.__name__ + "("):  # not dataclass's own
            out.append(" ".join(inspect.cleandoc(cls.__doc__).split()) + "\n")
        out.append("| key | type | default | meaning |\n|---|---|---|---|")
        out.extend(rows)
    out.append("\n## Keys and sections read at a new place\n")
    out.append("A config may still spell these keys and sections the old way (each key of one source, one "
               "way: both spellings of one key in one file or command line is an error).\n")
    out.append("| old key or section | read as |\n|---|---|")
    out.extend(f"| `{k}{_star(v)}` | `{v}{_star(v)}` |" for k, v in ALIASES.items())
    out.append("\n## Keys of earlier versions\n")
    out.append("A config that still uses one of these stops with a message naming its replacement "
               "(CHANGELOG.md).\n")
    out.append("| old key | now |\n|---|---|")
    out.extend(f"| `{k}` | {v} |" for k, v in RENAMED.items())
    out.extend(f"| `{k}` | removed: {v} |" for k, v in REMOVED.items())
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
