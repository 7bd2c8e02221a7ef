"""From a completion to the program the sandbox runs: the code block, assembled onto the task's prompt.

Chat models answer with prose and a ```python block, base models continue the prompt's code; both
are read the way HumanEval's harness reads them (`prompt + completion`), with one allowance for
chat models: a completion that writes the whole entry-point function replaces the prompt's stub
instead of being appended after it (appended, it would follow a `def` with no body).
"""

from __future__ import annotations

import re

from mentor_fast.types import CodeTask

_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[ \t]*$")  # a fence line, and its language tag
_PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3"})


def _blocks(lines: list[str]) -> tuple[list[tuple[str, list[str]]], list[str] | None]:
    """(tag, lines) of every closed block, and the lines of an unterminated final block (or None).
    A tagged fence inside a block closes it and opens the next (a model that forgot a close)."""
    blocks: list[tuple[str, list[str]]] = []
    tag, body = "", None
    for line in lines:
        m = _FENCE_RE.match(line)
        if m is None:
            if body is not None:
                body.append(line)
            continue
        if body is not None:
            blocks.append((tag, body))
        tag, body = (m.group(1).lower(), []) if body is None or m.group(1) else ("", None)
    return blocks, body


def _tidy(lines: list[str]) -> str | None:
    """Leading blank lines and trailing whitespace dropped, and a "```" glued to the last line; the
    first line's indentation is kept (a body continuation starts indented)."""
    while lines and not lines[0].strip():
        lines = lines[1:]
    text = "\n".join(lines).rstrip()
    if text.endswith("```"):
        text = text[:-3].rstrip()
    return text + "\n" if text.strip() else None


def extract_code(completion: str) -> str | None:
    """The last fenced block of `completion` (untagged or tagged python/py/python3; the last block of
    any tag when none is), an unterminated final fence counting up to the end of the text; with no
    fence, the whole completion. None when that is blank.

    A fence opened on the completion's last non-blank line is a leftover close (a base model ending
    its continuation with "```"), not an empty block."""
    lines = completion.split("\n")
    blocks, open_body = _blocks(lines)
    if open_body is not None and any(line.strip() for line in open_body):
        blocks.append(("", open_body))
    elif open_body is not None and not blocks:  # "    return x\n```": the code is what precedes it
        last_fence = max(i for i, line in enumerate(lines) if _FENCE_RE.match(line))
        return _tidy(lines[:last_fence])
    if not blocks:
        return _tidy(lines)
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    return _tidy(python[-1] if python else blocks[-1][1])


def _def_line(code: str, name: str) -> re.Match[str] | None:
    """Where `code` defines `name` at top level (a `def` at column 0)."""
    return re.search(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code, re.MULTILINE)


def assemble_program(completion: str, task: CodeTask) -> str | None:
    """The program to run for `completion` (None when it has no code).

    No prompt: the extracted code. With a prompt (HumanEval): code that defines the entry point at
    top level follows the prompt's text before its `def <entry_point>` line (its imports and helper
    functions, e.g. HumanEval/38's encode_cyclic); anything else continues the prompt (prompt + code).
    Style "stdio": that program bound as text, `SOURCE = '...'`, for the tests to run per input."""
    code = extract_code(completion)
    return None if code is None else program_from_code(code, task)


def program_from_code(code: str, task: CodeTask) -> str:
    """`assemble_program` for code already extracted from its completion."""
    program = code
    if task.prompt:
        prompt = task.prompt if task.prompt.endswith("\n") else task.prompt + "\n"
        if task.entry_point and _def_line(code, task.entry_point):
            stub = _def_line(prompt, task.entry_point)
            program = (prompt[: stub.start()] if stub else prompt) + code
        else:
            program = prompt + code
    if task.style == "stdio":
        return f"SOURCE = {program!r}\n"
    return program
