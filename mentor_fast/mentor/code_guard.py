"""Leak gates for code hints (task="code"), run by `guard.LeakGuard` in place of the math gold gates.

A code hint may say what kind of mistake was made, which kind of input fails, what to import and the
steps of a solution in words. It may not give code, copy the reference program, or state what a
hidden test expects. The gates, in order, each with its own name in `guard.LEAK_GATES`:
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
from fractions import Fraction
from typing import Any

from mentor_fast.mentor.diagnosis import IMPORTABLE
from mentor_fast.mentor.numbers import find_numbers, normalize_math_text, outermost
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
_STATES_OUTPUT = re.compile(
    r"(?:\b(?:returns?|returning|returned|outputs?|prints?|printing|printed|gives?|giving|yields?|"
    r"evaluates?\s+to|expected|expects?|expecting|equals?|equal\s+to|produces?|answer|result)\b|==|->|=>|:)"
    r"(?:\s+(?:is|are|was|be|should\s+be|must\s+be|will\s+be|would\s+be|exactly|just|simply|always|then|"
    r"the\s+value|value|of))*\s*[`'\"(\[]?$",
    re.IGNORECASE,
)
_EMPTY_WORDS = {str: "string", list: "list", tuple: "tuple", dict: "dict(?:ionary)?", set: "set"}
_MISSING = object()


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


# ---------------------------------------------------------------- expected outputs of the tests


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _MISSING


def _expected(test: ast.AST) -> Any:
    """What an assert expects of the program: `f(x) == y` -> y, `f(x) is None` -> None,
    `abs(f(x) - y) < tol` -> y, `not f(x)` -> False, `f(x)` -> True."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right, op = test.left, test.comparators[0], test.ops[0]
        if isinstance(op, (ast.Eq, ast.Is)) and _has_call(left) != _has_call(right):
            return _literal(right if _has_call(left) else left)
        if (
            isinstance(op, (ast.Lt, ast.LtE))
            and isinstance(left, ast.Call)
            and getattr(left.func, "id", "") == "abs"
            and left.args
            and isinstance(left.args[0], ast.BinOp)
            and isinstance(left.args[0].op, ast.Sub)
        ):
            a, b = left.args[0].left, left.args[0].right
            return _literal(b if _has_call(a) else a) if _has_call(a) != _has_call(b) else _MISSING
        return _MISSING
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _has_call(test.operand):
        return False
    return True if isinstance(test, ast.Call) else _MISSING


def expected_outputs(tests: str) -> list[Any]:
    """The literal values the tests' asserts expect, in order, duplicates dropped."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return []
    out: list[Any] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            v = _expected(node.test)
            if v is not _MISSING and not any(type(v) is type(o) and v == o for o in out):
                out.append(v)
    return out


def _number(v: Any) -> Fraction | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return Fraction(repr(v)) if isinstance(v, float) else Fraction(v)
    except ValueError:  # inf, nan
        return None


def _compact(text: str) -> str:
    return re.sub(r"\s+", "", text).replace('"', "'")


def _spans(hint: str, v: Any) -> tuple[str, list[tuple[int, int]], bool]:
    """(text searched, spans where `hint` writes the value v, whether v is tiny)."""
    num = _number(v)
    if num is not None:
        text = normalize_math_text(hint)
        spans = [(m.start, m.end) for m in outermost(find_numbers(text)) if num in m.values]
        return text, spans, len(repr(v)) <= 2
    if isinstance(v, bool) or v is None:
        flags = re.IGNORECASE if isinstance(v, bool) else 0
        return hint, [m.span() for m in re.finditer(rf"\b{v!r}\b", hint, flags)], True
    if isinstance(v, (str, list, tuple, dict, set)) and not v:
        forms = rf"{re.escape(repr(v))}|\"\"|\b(?:an?|the)\s+empty\s+{_EMPTY_WORDS[type(v)]}\b"
        return hint, [m.span() for m in re.finditer(forms, hint, re.IGNORECASE)], True
    if isinstance(v, str):
        s = v.strip()
        quoted = rf"['\"`]{re.escape(s)}['\"`]"
        if len(s) <= 3:  # "a", "yes", "ab" are words too: only quoted, and only where stated
            return hint, [m.span() for m in re.finditer(quoted, hint)], True
        bare = rf"(?<!\w){re.escape(s)}(?!\w)"
        return hint, [m.span() for m in re.finditer(f"{quoted}|{bare}", hint)], False
    if isinstance(v, (list, tuple, set, dict)):
        inner = _compact(repr(v))[1:-1]
        text = _compact(hint)
        spans = [m.span() for m in re.finditer(rf"[\[({{]{re.escape(inner)}[\])}}]", text)]
        return text, spans, False
    return hint, [], False


def _in_question(v: Any, question: str) -> bool:
    return bool(question) and bool(_spans(question, v)[1])


def _states_output(text: str, start: int) -> bool:
    sentence = re.split(r"[.!?;\n]\s|\n", text[:start])[-1]
    return _STATES_OUTPUT.search(sentence.rstrip()) is not None or not text[:start].strip()


_LIST_MARKER = re.compile(r"\)\s")  # "Plan: 1) Keep ...": the number of a step, not a value


def stated_output(hint: str, outputs: tuple[Any, ...]) -> str | None:
    for v in outputs:
        text, spans, tiny = _spans(hint, v)
        for start, end in spans:
            if tiny and _LIST_MARKER.match(text, end):
                continue
            if not tiny or _states_output(text, start):
                return f"'{text[start:end]}' (a hidden test expects {v!r})"
    return None


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
            {_compact(c) for c in re.findall(r"[\w.']+\(\s*[A-Za-z_][\w.]*\(", code)}
            - {c for c in re.findall(r"[\w.']+\([A-Za-z_][\w.]*\(", _compact(question))}
        )
    )
    outputs = tuple(v for v in expected_outputs(tests) if not _in_question(v, question))
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
    return isinstance(node, ast.Return) and node.value is not None and _literal(node.value) is not _MISSING


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
    compact = _compact(hint)
    for c in prof.chains:
        if c in compact:
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


def find_code_leak(hint: str, gold: str, code: CodeTask | None, question: str = "") -> tuple[str, str] | None:
    """(gate, why) for the first code gate that rejects `hint`, or None. The reference program is
    `code.reference`, else `gold` (a code problem's gold is its reference program); `question`
    (with `code.prompt`) is what the learner sees, so what it shows is never a leak."""
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
        (code.reference if code and code.reference else gold) or "", code.tests if code else "", seen
    )
    where = stated_output(hint, prof.outputs)
    if where:
        return "test_output", f"the hint states a hidden test's expected output: {where}"
    return _copied(hint, prof)
