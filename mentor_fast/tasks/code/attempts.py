"""How a code attempt failed, read from its sandbox result (`Rollout.verifier_detail`, a
`rewards.code.CodeResult`, read by its fields so that the mentor does not import the rewards):
`code_failure` puts each attempt on the closed code taxonomy, and attempts are told apart by how
they failed (status, exception, failing test line) the way math attempts are by their final answer.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from mentor_fast.types import Rollout

# names an import provides (the module to import), for NameErrors that are a missing import
IMPORTABLE = {
    **dict.fromkeys(
        ("List", "Dict", "Tuple", "Set", "Optional", "Any", "Union", "Callable", "Iterable"), "typing"
    ),
    **dict.fromkeys(("Counter", "defaultdict", "deque", "OrderedDict", "namedtuple"), "collections"),
    **dict.fromkeys(("reduce", "lru_cache", "cache", "partial", "cmp_to_key"), "functools"),
    **dict.fromkeys(("heappush", "heappop", "heapify", "nlargest", "nsmallest"), "heapq"),
    **dict.fromkeys(
        ("permutations", "combinations", "product", "accumulate", "chain", "groupby"), "itertools"
    ),
    **dict.fromkeys(("bisect_left", "bisect_right", "insort"), "bisect"),
    **dict.fromkeys(("sqrt", "gcd", "floor", "ceil", "factorial", "comb", "isqrt", "log", "inf"), "math"),
    "Fraction": "fractions",
    "Decimal": "decimal",
}


def code_result(rollout: Rollout) -> Any:
    """The attempt's sandbox result (a CodeResult), or None."""
    d = rollout.verifier_detail
    return d if all(hasattr(d, a) for a in ("status", "exception", "test_line")) else None


def looks_like_code(text: str) -> bool:
    return (
        "```" in text
        or re.search(r"(?m)^(?:\s*(?:def|class|import|from|return|for|while|if|print)\b| {4}\S|\t\S)", text)
        is not None
    )


def missing_name(message: str) -> str:
    """The name of "name 'x' is not defined" / "No module named 'x'" ("" when there is none)."""
    m = re.search(r"(?:name|named) '([\w.]+)'", message)
    return m.group(1) if m else ""


# Sandbox statuses that say how the attempt failed without reading its exception. crashed: killed
# (memory, output cap) or exited early; forged_output and channel_closed: it wrote to or closed the
# channel to the checker. unsupported (what the tests need cannot cross between the two processes),
# bad_problem and sandbox_error are not the attempt's doing: "other".
_STATUS_LABELS = {"timeout": "timeout", "failed": "wrong_output", "crashed": "exception",
                  "forged_output": "exception", "channel_closed": "exception"}


def code_failure(rollout: Rollout) -> str:
    """The code taxonomy's label of one failed attempt, from its sandbox result."""
    res, ep = code_result(rollout), (rollout.problem.code.entry_point if rollout.problem.code else "")
    if res is None:  # not run: no code, or nothing to read (an empty attempt says nothing)
        if rollout.truncated:
            return "truncation"
        return "format" if rollout.text.strip() and not looks_like_code(rollout.text) else "other"
    exc, msg = res.exception, res.message
    if res.status in _STATUS_LABELS:
        return _STATUS_LABELS[res.status]
    if res.status != "error":  # sandbox_error, bad_problem, unsupported (not the attempt's fault), or a pass marked wrong
        return "other"
    if exc in ("SyntaxError", "IndentationError", "TabError"):
        return "syntax" if looks_like_code(rollout.text) else "format"
    if exc in ("ModuleNotFoundError", "ImportError"):
        return "missing_import"
    name = missing_name(msg)
    if exc == "NameError" and ep and name == ep:
        return "signature"
    if exc == "NameError" and (name in IMPORTABLE or name in sys.stdlib_module_names):
        return "missing_import"
    if exc == "TypeError" and ep and re.match(rf"{re.escape(ep)}\(\) (?:missing|takes|got)", msg):
        return "signature"
    return "exception"


def code_key(rollout: Rollout) -> str:
    """How a code attempt ended: its failure label, exception or status, failing test line."""
    res, label = code_result(rollout), code_failure(rollout)
    if res is None:
        return {"format": "<no code>", "truncation": "<truncated>"}.get(label, "<not run>")
    why = res.exception or res.status
    return f"{label}: {why}" + (f" at {res.test_line.strip()}" if res.test_line.strip() else "")


def render_sandbox(rollout: Rollout) -> str:
    """What the sandbox said about a code attempt: what the LLM diagnoser reads."""
    res = code_result(rollout)
    if res is None:
        return f"Sandbox: not run ({code_failure(rollout)})"
    lines = [
        f"Sandbox: {res.status}"
        + (f", {res.exception}" if res.exception else "")
        + (f": {res.message.strip()[:300]}" if res.message.strip() else "")
    ]
    if res.test_line.strip():
        lines.append(f"Failing test: {res.test_line.strip()}")
    lines.append(f"Failure kind: {code_failure(rollout)}")
    return "\n".join(lines)
