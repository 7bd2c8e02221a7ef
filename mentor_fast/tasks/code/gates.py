"""The code leak gates, run by the leak guard (mentor/guard.py) for code tasks, after its shared gates.

A code hint may say what kind of mistake was made, which kind of input fails, what to import and the
steps of a solution in words. It may not give code, copy the reference program, or state what a
hidden test expects. The gates, in order:
- `code_block`: any fence (the learner's code format, as `\\boxed` is math's) or an indented block:
  2+ consecutive lines indented by 4 spaces or a tab that parse as Python or hold return/for/if ...:.
- `code_def`: a `def`, a `class` or a `lambda ...:`.
- `code_inline`: a statement written inline: in backticks (`return x[::-1]`), or in the prose when it
  parses and carries code punctuation ("for i in range(n):", "count = len(xs)"). Bare expressions
  (`total(xs)`, the signature) and imports ("import math", the missing_import fix) are allowed.
- `test_output`: a hidden test's expected output (the literal right-hand side of `assert ... ==`)
  that the question does not show. Tiny values (0, 1, True, None, "", [], any <= 2 characters)
  count only where the hint states a result ("should return 0", "returns 1", "== 0"), as the math
  gold_context gate does for short golds; larger ones count anywhere.
- `code_line`: a whole line of the reference (4+ tokens), whitespace-insensitive, not in the question.
- `code_identifier`: a name of the reference that the question does not use: distinctive names
  (`seen_set`, `dp2`, `maxLen`) anywhere, plain-word names (`seen`, `count`) only in code context
  (`seen[`, `count =`, `seen.add`, backticks); or a call chain of the reference (`sorted(set(`).
  Builtins, keywords, builtin-type methods and stdlib module names are no one's solution.
- `code_overlap`: CODE_NGRAM code tokens in a row shared with the reference (comments and
  docstrings dropped) and not in the question.
"""

from __future__ import annotations

import ast
import builtins
import functools
import keyword
import re
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

from mentor_fast.tasks.code.attempts import IMPORTABLE
from mentor_fast.tasks.code.outputs import (
    MISSING,
    compact,
    expected_outputs,
    in_question,
    literal,
    stated_output,
)
from mentor_fast.types import CodeTask

CODE_GATES = (
    "code_block",
    "code_def",
    "code_inline",
    "test_output",
    "code_line",
    "code_identifier",
    "code_overlap",
)
CODE_NGRAM = 6
LINE_TOKENS = 4

_TOKEN = re.compile(
    r"""[A-Za-z_]\w*|\d+(?:\.\d+)?|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|==|!=|<=|>=|//|\*\*|->|[-+*/%]="""
    r"""|[-+*/%<>=:,.()\[\]{}]"""
)
_BACKTICK = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_STMT_START = re.compile(
    r"\b(?:return|yield|for|while|if|elif|raise|assert|del)\b|\b(?P<target>[A-Za-z_]\w*)(?:\[[^\]\n]*\])?"
    r"\s*(?:[-+*/%]?=)(?!=)"
)
_CODE_PUNCT = re.compile(r"[\[\](){}<>=+*/%:]|\w\s*-\s*\w|\.[A-Za-z_]")
_BLOCKY = re.compile(r"\breturn\b|^\s*(?:for|while|if|elif|else|try|except)\b.*:\s*$", re.MULTILINE)
_GENERIC = frozenset(
    [*keyword.kwlist, *dir(builtins), *sys.stdlib_module_names, *IMPORTABLE, "self", "cls", "candidate"]
    + [a for t in (str, list, dict, set, tuple, int, float) for a in dir(t)]
)


def code_tokens(text: str) -> list[str]:
    """Code tokens; string literals in one canonical quoting (ast.unparse writes single quotes)."""
    out = []
    for tok in _TOKEN.findall(text):
        if tok[0] in "'\"":
            try:
                tok = repr(ast.literal_eval(tok))
            except (ValueError, SyntaxError):
                pass
        out.append(tok)
    return out


def _joined(tokens: list[str] | tuple[str, ...]) -> str:
    return "\x1f" + "\x1f".join(tokens) + "\x1f"  # a separator no token holds: exact token runs


def _clean(reference: str) -> str:
    """The reference without comments and docstrings (they are prose the hint may share)."""
    try:
        tree = ast.parse(reference)
    except SyntaxError:
        return re.sub(r"#[^\n]*", "", reference)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


# ---------------------------------------------------------------- what the reference gives away


@dataclass(frozen=True)
class CodeProfile:
    """What the gates compare a hint with, computed once per problem (`profile`)."""

    lines: tuple[tuple[str, ...], ...]  # token runs of the reference's lines (LINE_TOKENS+ tokens)
    grams: frozenset[tuple[str, ...]]  # CODE_NGRAM-token runs of the reference, not in the question
    names: frozenset[str]  # distinctive identifiers of the reference, not in the question
    words: frozenset[str]  # plain-word identifiers: count only in code context
    chains: tuple[str, ...]  # nested calls of the reference, compact ("sorted(set(")
    outputs: tuple[Any, ...]  # expected outputs of the hidden tests that the question does not show


def _distinctive(name: str) -> bool:
    return (
        "_" in name.strip("_")
        or any(c.isdigit() for c in name)
        or (name != name.lower() and name != name.upper())
    )


@functools.lru_cache(maxsize=512)
def profile(reference: str, tests: str, question: str) -> CodeProfile:
    code = _clean(reference) if reference.strip() else ""
    q_tokens = _joined(code_tokens(question))
    q_words = set(re.findall(r"[A-Za-z_]\w*", question))
    lines = tuple(
        toks
        for toks in (tuple(code_tokens(ln)) for ln in code.splitlines())
        if len(toks) >= LINE_TOKENS
        and any(not re.fullmatch(r"\w+", t) for t in toks)
        and _joined(toks) not in q_tokens
    )
    grams: set[tuple[str, ...]] = set()
    for ln in code.splitlines():  # runs inside one line: a hint's prose has no line structure
        toks = code_tokens(ln)
        for i in range(len(toks) - CODE_NGRAM + 1):
            g = tuple(toks[i : i + CODE_NGRAM])
            if any(not re.fullmatch(r"\w+", t) for t in g) and _joined(g) not in q_tokens:
                grams.add(g)
    names: set[str] = set()
    try:
        for node in ast.walk(ast.parse(code)):
            names.update(
                n
                for n in (
                    getattr(node, "id", None),
                    getattr(node, "arg", None),
                    getattr(node, "name", None),
                    getattr(node, "attr", None),
                )
                if isinstance(n, str)
            )
    except SyntaxError:
        names.update(re.findall(r"[A-Za-z_]\w*", code))
    names = {n for n in names if len(n) > 1 and n not in _GENERIC and n not in q_words}
    chains = tuple(
        sorted(
            {compact(c) for c in re.findall(r"[\w.']+\(\s*[A-Za-z_][\w.]*\(", code)}
            - {c for c in re.findall(r"[\w.']+\([A-Za-z_][\w.]*\(", compact(question))}
        )
    )
    outputs = tuple(v for v in expected_outputs(tests) if not in_question(v, question))
    return CodeProfile(
        lines,
        frozenset(grams),
        frozenset(n for n in names if _distinctive(n)),
        frozenset(n for n in names if not _distinctive(n)),
        chains,
        outputs,
    )


# ---------------------------------------------------------------- the gates


def _parses_as_statement(src: str) -> bool:
    """`src` is Python with a statement beyond bare expressions and imports ("return x", "for i in
    range(n):"; a trailing ":" gets a body to parse)."""
    src = src.strip().rstrip(".,;").strip()
    for candidate in (src, f"{src}\n    pass") if src.endswith(":") else (src,):
        try:
            tree = ast.parse(candidate)
        except (SyntaxError, ValueError):
            continue
        return any(
            not isinstance(n, (ast.Expr, ast.Import, ast.ImportFrom, ast.Pass)) and not _says_value(n)
            for n in tree.body
        )
    return False


def _says_value(node: ast.stmt) -> bool:
    """ "return [1, 3]": words about a value (the test_output gate judges the value), not code."""
    return isinstance(node, ast.Return) and node.value is not None and literal(node.value) is not MISSING


def _inline_statement(hint: str) -> str | None:
    for m in _BACKTICK.finditer(hint):
        if _parses_as_statement(m.group(1)):
            return m.group(1)
    prose = _BACKTICK.sub(" ", hint)
    for m in _STMT_START.finditer(prose):
        rest = re.split(r"\n|;\s|\.\s|\.$", prose[m.start() :])[0]
        cuts = [rest, *(rest[: c.start()] for c in reversed(list(re.finditer(r"\s", rest))))]
        for frag in cuts:  # longest first: "return x[::-1], which reverses it" -> "return x[::-1],"
            # code punctuation after the keyword or the "=", a header's ":" aside: "n = 1" and
            # "if done:" read as prose, "for i in range(n):" and "count = len(xs)" as code
            tail = frag[m.end() - m.start() :]
            tail = tail.split(":")[0] if m.group(0) in ("if", "elif", "for", "while") else tail
            target = m.group("target")
            if (_CODE_PUNCT.search(tail) or (target and len(target) > 1)) and _parses_as_statement(frag):
                return frag.strip()
    return None


def _indented_block(hint: str) -> str | None:
    run: list[str] = []
    for ln in [*hint.splitlines(), ""]:
        if re.match(r"(?: {4}|\t)\s*\S", ln):
            run.append(ln)
            continue
        if len(run) >= 2:
            src = textwrap.dedent("\n".join(run))
            try:
                tree = ast.parse(src)
                code = any(
                    not (isinstance(n, ast.Expr) and isinstance(n.value, (ast.Name, ast.Constant)))
                    for n in tree.body
                )
            except SyntaxError:
                code = False
            if code or _BLOCKY.search(src):
                return f"an indented block of {len(run)} lines"
        run = []
    return None


def _identifier(hint: str, prof: CodeProfile) -> str | None:
    for n in sorted(prof.names):
        if re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", hint):
            return f"the reference's name '{n}'"
    ticks = " ".join(_BACKTICK.findall(hint))
    for n in sorted(prof.words):
        in_code = rf"(?<![\w.]){re.escape(n)}\s*(?:\(|\[|\.[A-Za-z_]|=(?!=)|[-+*/%]=)"
        if re.search(in_code, hint) or re.search(rf"\b{re.escape(n)}\b", ticks):
            return f"the reference's name '{n}' in code"
    flat = compact(hint)
    for c in prof.chains:
        if c in flat:
            return f"the reference's call '{c}'"
    return None


def _copied(hint: str, prof: CodeProfile) -> tuple[str, str] | None:
    toks = code_tokens(hint)
    joined = _joined(toks)
    for line in prof.lines:
        if _joined(line) in joined:
            return "code_line", f"a line of the reference ('{' '.join(line)}')"
    bad = _identifier(hint, prof)
    if bad:
        return "code_identifier", bad
    for i in range(len(toks) - CODE_NGRAM + 1):
        if tuple(toks[i : i + CODE_NGRAM]) in prof.grams:
            return "code_overlap", f"copies the reference ('{' '.join(toks[i : i + CODE_NGRAM])}')"
    return None


def code_leak(
    hint: str, gold: str, steps: tuple[str, ...], code: CodeTask | None, question: str = ""
) -> tuple[str, str] | None:
    """(gate, why) for the first code gate that rejects `hint`, or None. The reference program is
    `code.solution`, else `gold` (a code problem's gold is its reference program); `question`
    (with `code.prompt`) is what the learner sees, so what it shows is never a leak. `steps` are
    the math gates' (the steps of a code solution are words, which a hint may share)."""
    if "```" in hint:
        return "code_block", "a fenced code block"
    block = _indented_block(hint)
    if block:
        return "code_block", block
    if re.search(r"\bdef\s+\w+\s*\(|\bclass\s+\w+\s*[:(]|\blambda\b[^:\n]{0,40}:", hint):
        return "code_def", "a function definition"
    stmt = _inline_statement(hint)
    if stmt:
        return "code_inline", f"a statement written out ('{stmt}')"
    seen = f"{question}\n{code.prompt if code else ''}"
    prof = profile(
        (code.solution if code and code.solution else gold) or "", code.tests if code else "", seen
    )
    where = stated_output(hint, prof.outputs)
    if where:
        return "test_output", f"the hint states a hidden test's expected output: {where}"
    return _copied(hint, prof)
