"""Math answer checking on math-verify, with a verdict the mentor can read.

Policy (as Scaf-GRPO's math reward, arXiv 2510.19807):
- gold: wrapped in `\\boxed{}` unless it already holds one, parsed with LaTeX extraction.
- prediction: when the completion has a complete `\\boxed{...}`, only the LAST one is parsed
  (math-verify alone would join several boxes into a set: "\\boxed{1} ... \\boxed{2}" -> {1, 2});
  otherwise the whole text is parsed with LaTeX + expression extraction ("The answer is 12" scores,
  with the note "no \\boxed answer"). Boxed answers get the top extraction priority.
- deviation: when the gold is a plain number, an answer that is still an unevaluated sum or product
  ("\\boxed{47 + 385 - 129}" for 303) is wrong. math-verify accepts it (it simplifies), which would
  let a policy earn reward on the arithmetic ladder by copying the question into the box.
  Fractions, powers and percentages are left to math-verify ("1/2", "2^{10}", "50\\%").

math-verify's timeouts use SIGALRM, which only works in a process's main thread; elsewhere
`signal.alarm` raises ValueError and a broad except would score everything 0 (verl #5635).
`verify` refuses to run with timeouts outside the main thread; `MathVerifierPool` runs it in
worker processes. math-verify is imported on first use, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import math
import re
import threading

from mentor_fast.answers import has_boxed, last_boxed
from mentor_fast.rewards.verdict import Status, Verdict

# What math-verify/latex2sympy/sympy raise on hostile input when asked to (raise_on_error=True):
# malformed expressions (ValueError incl. SympifyError, TypeError), overflow and division
# (ArithmeticError), deep nesting (RecursionError), and out-of-range indexing inside sympy's
# printers/solvers (IndexError). Anything else is a bug and propagates.
BAD_INPUT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    ArithmeticError,
    RecursionError,
    IndexError,
)

# A digit, a binary + - * (or \times, \cdot), a digit: the answer was not evaluated.
_UNEVALUATED_RE = re.compile(r"\d\s*(?:[+\-*×]|\\times|\\cdot)\s*\d")


@functools.cache
def _mv():
    """math-verify's entry points and configs, imported once on first use."""
    import math_verify
    from math_verify.errors import TimeoutException

    gold_cfg = (math_verify.LatexExtractionConfig(),)
    pred_cfg = (
        math_verify.LatexExtractionConfig(boxed_match_priority=0),
        math_verify.ExprExtractionConfig(),
    )
    return math_verify, TimeoutException, gold_cfg, pred_cfg


def _check_thread(timeout_s: int | None) -> None:
    if timeout_s and threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "math-verify timeouts use SIGALRM and only work in the main thread; score from threads "
            "through MathVerifierPool, or pass timeout_s=None and enforce a timeout yourself"
        )


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout_s: int | None) -> tuple:
    mv, _, gold_cfg, _ = _mv()
    text = gold if has_boxed(gold) else f"\\boxed{{{gold}}}"
    return tuple(mv.parse(text, list(gold_cfg), parsing_timeout=timeout_s, raise_on_error=True))


def _shown(parsed: list) -> str:
    """The answer as text: math-verify returns [sympy_obj, source_str] or [fallback_str]."""
    return str(parsed[-1]) if isinstance(parsed[-1], str) else str(parsed[0])


def _is_number(obj) -> bool:
    import sympy

    return isinstance(obj, sympy.Number)


def verify(completion: str, gold: str, *, timeout_s: float | None = 5) -> Verdict:
    """Check one completion against the gold answer (in this process; see module docstring).

    timeout_s: math-verify's SIGALRM timeout per parse / comparison, rounded up to whole seconds
    (main thread only; None: off).
    """
    _check_thread(timeout_s)
    timeout_s = None if timeout_s is None else max(1, math.ceil(timeout_s))
    mv, timeout_exc, _, pred_cfg = _mv()
    boxed = last_boxed(completion)
    prefix = "" if boxed is not None else "no \\boxed answer; "
    stage = "gold"
    try:
        gold_parsed = _parse_gold(gold, timeout_s)
        if not gold_parsed:  # every completion would score 0: make it visible as an error
            note = f"gold answer {gold!r} is unparseable"
            return Verdict(False, None, note, Status.ERROR, "GoldUnparseable")
        stage = "answer"
        pred_text = completion if boxed is None else f"\\boxed{{{boxed}}}"
        pred = mv.parse(pred_text, list(pred_cfg), parsing_timeout=timeout_s, raise_on_error=True)
        if not pred:
            what = "no answer found" if boxed is None else f"unparseable answer {boxed!r}"
            status = Status.NO_ANSWER if boxed is None else Status.UNPARSEABLE
            return Verdict(False, boxed, prefix + what, status)
        shown = _shown(pred)
        if all(isinstance(p, str) for p in pred):
            return Verdict(False, shown, f"{prefix}unparseable answer {shown!r}", Status.UNPARSEABLE)
        stage = "comparison"
        correct = mv.verify(list(gold_parsed), pred, timeout_seconds=timeout_s, raise_on_error=True)
    except timeout_exc:
        note = f"{prefix}verifier timed out ({stage})"
        return Verdict(False, None, note, Status.TIMEOUT, "TimeoutException")
    except BAD_INPUT_ERRORS as e:
        name = type(e).__name__
        return Verdict(False, None, f"{prefix}{stage} raised {name}", Status.ERROR, name)
    if correct and gold_parsed and _is_number(gold_parsed[0]) and _UNEVALUATED_RE.search(shown):
        return Verdict(False, shown, f"{prefix}extracted {shown} is not evaluated, expected {gold}")
    verdict = "correct: extracted" if correct else "extracted"
    tail = "" if correct else f", expected {gold}"
    return Verdict(bool(correct), shown, f"{prefix}{verdict} {shown}{tail}")


def is_correct(completion: str, gold: str) -> bool:
    """The public contract: True iff the completion's final answer equals the gold answer."""
    return verify(completion, gold).correct
