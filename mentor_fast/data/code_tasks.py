"""The code ladder's task templates, levels 1-4 (5-7, the jump, are in data/code_tasks_jump.py).

| lvl | what                                  | example                                                     |
|-----|---------------------------------------|-------------------------------------------------------------|
| 1   | one arithmetic operation on an int    | `add_7(x: int) -> int` returns x plus 7                     |
| 2   | one builtin on a string or a list     | reverse a string; sum, max of a list; count a letter        |
| 3   | a loop with a condition               | count the numbers above 12; sum of the even numbers         |
| 4   | string processing                     | count the vowels, the digits, a letter in either case       |
| 5   | two stated steps                      | sum of the squares of the numbers above 3                   |
| 6   | the jump: a step the question implies | 2nd-largest distinct value or None; pairs summing to T      |
| 7   | a rule defined under a made-up name   | a word's "heft": vowels 4, other letters 1, the rest 0      |

A template draws its parameters (constants, names, list contents) from the problem's rng and returns
a Task: the question's parts, the reference body, the steps in words (no code, no identifier but
the function name), one regex per step that an attempt containing that step matches, the argument
tuples of the tests, and `logic`: an implementation written apart from the reference that computes
each expected value at generation time. That the reference passes its own tests is therefore a
check of two implementations against each other (tests/test_code_data.py runs it in the sandbox).
"""

from __future__ import annotations

import copy
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Task:
    signature: str  # "count_vowels(s: str) -> int"
    does: str  # the question's predicate: "returns the number of vowels in s"
    body: str  # the reference function's body, indented by four spaces
    steps: tuple[str, ...]  # the reference's steps in words
    markers: tuple[str, ...]  # one regex per step
    cases: tuple[tuple, ...]  # argument tuples, one assert each
    logic: Callable[..., Any]  # computes the expected value of each case
    preamble: str = ""  # a definition the question states before the task (level 7)

    @property
    def name(self) -> str:
        return self.signature.split("(", 1)[0]

    @property
    def question(self) -> str:
        return f"{self.preamble}Write a Python function `{self.signature}` that {self.does}."

    @property
    def solution(self) -> str:
        body = self.body.strip("\n").rstrip()
        return f"def {self.signature}:\n{body}\n"

    def expected(self) -> list[Any]:
        return [self.logic(*copy.deepcopy(args)) for args in self.cases]

    def tests(self) -> str:
        """One assert per case; `is None` where None is expected, so 0 or "" cannot pass for it."""
        lines = []
        for args, want in zip(self.cases, self.expected(), strict=True):
            call = f"{self.name}({', '.join(repr(a) for a in args)})"
            lines.append(f"assert {call} is None" if want is None else f"assert {call} == {want!r}")
        return "\n".join(lines) + "\n"


Template = Callable[[random.Random], Task]
WORDS = ("apple", "sky", "banana", "rhythm", "queue", "idea", "stone", "xyz", "level", "ocean", "tree")
START = r"=\s*0\b|sum\(|len\("  # the marker of "start a count (or total) at zero"
RETURN = r"\breturn\b"


def ints(rng: random.Random, n: int, lo: int = -20, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def mixed(rng: random.Random, alphabet: str, lo: int = 4, hi: int = 12) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def list_arg(rng: random.Random) -> str:
    return rng.choice(["nums", "numbers", "values", "xs", "items"])


def str_arg(rng: random.Random) -> str:
    return rng.choice(["s", "text", "word", "line", "string"])


# -- level 1: one operation -------------------------------------------------------------------------


def _arith(rng: random.Random) -> Task:
    k, arg = rng.randint(2, 99), rng.choice(["x", "n", "value"])
    op, word, names, step, logic = rng.choice([
        ("+", "plus", ["add", "plus", "increase_by"], f"Add {k} to the input", lambda x: x + k),
        ("*", "times", ["times", "multiply_by", "scale_by"], f"Multiply the input by {k}", lambda x: x * k),
        ("-", "minus", ["minus", "subtract", "decrease_by"], f"Subtract {k} from the input", lambda x: x - k),
    ])
    marker = rf"-\s*{k}\b" if op == "-" else rf"\{op}\s*{k}\b|\b{k}\s*\{op}"
    cases = ((0,), (1,), (-rng.randint(1, 50),), (rng.randint(2, 99),), (rng.randint(100, 999),))
    return Task(f"{rng.choice(names)}_{k}({arg}: int) -> int", f"returns {arg} {word} {k}",
                f"    return {arg} {op} {k}", (f"{step} and return the result.",), (marker,), cases, logic)


# -- level 2: one builtin ---------------------------------------------------------------------------


def _reverse(rng: random.Random) -> Task:
    arg = str_arg(rng)
    cases = (("",), ("a",), ("ab",), ("racecar",), (rng.choice(WORDS),), (mixed(rng, "abcXYZ 12"),))
    return Task(f"{rng.choice(['reverse_string', 'reverse_text', 'reversed_string'])}({arg}: str) -> str",
                f"returns {arg} reversed (its characters in the opposite order)", f"    return {arg}[::-1]",
                ("Return the characters of the string in the opposite order.",),
                (r"\[\s*::\s*-1\s*\]|reversed\(|\.reverse\(|-\s*1\s*\)",), cases,
                lambda s: "".join(s[i] for i in range(len(s) - 1, -1, -1)))


def _total(rng: random.Random) -> Task:
    arg = list_arg(rng)
    cases = (([],), ([5],), ([-3, -4],), (ints(rng, 4),), (ints(rng, 7, -99, 99),))

    def logic(xs: list[int]) -> int:
        out = 0
        for x in xs:
            out += x
        return out

    return Task(f"{rng.choice(['total', 'sum_list', 'add_all'])}({arg}: list[int]) -> int",
                f"returns the sum of the numbers in {arg} (0 for an empty list)", f"    return sum({arg})",
                ("Add up all the numbers of the list and return the total.",), (r"sum\(|\+",), cases, logic)


def _extreme(rng: random.Random) -> Task:
    arg, big = list_arg(rng), rng.random() < 0.5
    word, fn = ("largest", "max") if big else ("smallest", "min")
    cases = (([7],), ([-5, -2, -9],), ([3, 3, 1, 3],), (ints(rng, 5),), (ints(rng, 8, -99, 99),))
    return Task(f"{rng.choice([word, f'{word}_number', f'find_{fn}'])}({arg}: list[int]) -> int",
                f"returns the {word} number in {arg} (the list is never empty)", f"    return {fn}({arg})",
                (f"Return the {word} number of the list.",), (rf"{fn}\(|sort|{'>' if big else '<'}",),
                cases, lambda xs: sorted(xs)[-1 if big else 0])


def _count_letter(rng: random.Random) -> Task:
    arg, c = str_arg(rng), rng.choice(string.ascii_lowercase)
    other = "".join(ch for ch in "abeilnorstxyz " if ch != c)
    cases = (("",), (c,), (other[:5],), (c * 3 + other[:2],), (mixed(rng, other[:6] + c * 2),),
             (mixed(rng, c + other[-4:], 8, 16),))
    return Task(f"{rng.choice(['count_letter', f'count_{c}', 'occurrences'])}({arg}: str) -> int",
                f"returns how many times the letter '{c}' occurs in {arg}", f"    return {arg}.count({c!r})",
                (f"Count the occurrences of the letter '{c}' in the string and return that count.",),
                (r"\.count\(|==",), cases, lambda s: sum(1 for ch in s if ch == c))


def _prefix(rng: random.Random) -> Task:
    arg, k = str_arg(rng), rng.randint(2, 12)
    cases = (("",), ("z" * (k - 1),), ("y" * k,), (mixed(rng, "abcdef", k + 1, k + 6),),
             (mixed(rng, "xyz 7", k + 2, k + 9),))
    return Task(f"{rng.choice(['first', 'first_chars', 'prefix', 'take_first'])}_{k}({arg}: str) -> str",
                f"returns the first {k} characters of {arg} (all of {arg} when it is shorter)",
                f"    return {arg}[:{k}]", (f"Return the characters of the string up to position {k}.",),
                (rf"\[\s*0?\s*:\s*{k}\s*\]",), cases,
                lambda s: "".join(ch for i, ch in enumerate(s) if i < k))


# -- level 3: a loop with a condition ---------------------------------------------------------------


def _count_above(rng: random.Random) -> Task:
    arg, t = list_arg(rng), rng.randint(1, 50)
    cases = (([],), ([t],), ([t + 1, t - 1],), ([-t, 0, t * 2],), (ints(rng, 6, -10, 2 * t + 10),),
             (ints(rng, 8, 0, 3 * t),))
    body = f"""
    count = 0
    for x in {arg}:
        if x > {t}:
            count += 1
    return count
"""
    name = rng.choice(["count_above", "count_greater", "how_many_above"])
    return Task(f"{name}_{t}({arg}: list[int]) -> int",
                f"returns how many numbers in {arg} are greater than {t}",
                body, ("Start a count at zero.", "Go through the numbers one by one.",
                       f"Add one to the count for each number greater than {t}.", "Return the count."),
                (START, r"\bfor\b", rf">\s*{t}\b|\b{t}\s*<|>=\s*{t + 1}\b", RETURN), cases,
                lambda xs: len([x for x in xs if x - t > 0]))


def _sum_multiples(rng: random.Random) -> Task:
    arg, d = list_arg(rng), rng.randint(2, 5)
    what = "even numbers" if d == 2 else f"numbers divisible by {d}"
    name = "sum_even" if d == 2 else f"sum_multiples_of_{d}"
    cases = (([],), ([d + 1],), ([d, 2 * d, 1],), ([-d, -1, 3 * d],), (ints(rng, 6),),
             (ints(rng, 8, -30, 30),))
    body = f"""
    total = 0
    for x in {arg}:
        if x % {d} == 0:
            total += x
    return total
"""
    return Task(f"{name}({arg}: list[int]) -> int",
                f"returns the sum of the {what} in {arg} (0 when there are none)",
                body, ("Start a total at zero.", "Go through the numbers one by one.",
                       f"Add a number to the total when it divides evenly by {d}.", "Return the total."),
                (r"=\s*0\b|sum\(", r"\bfor\b", rf"%\s*{d}\b", RETURN), cases,
                lambda xs: sum(x for x in xs if (x // d) * d == x))


# -- level 4: string processing ---------------------------------------------------------------------

_CHAR_STEPS = ("Start a count at zero.", "Go through the characters one by one.")


def _count_vowels(rng: random.Random) -> Task:
    arg = str_arg(rng)
    cases = (("",), ("xyz",), ("AEIOU",), ("Hello World",), (rng.choice(WORDS).upper(),),
             (mixed(rng, "aAeEbcdxyz19 ", 6, 14),), (mixed(rng, "ouiOUIkmn", 5, 10),))
    return Task(f"{rng.choice(['count_vowels', 'vowel_count', 'num_vowels'])}({arg}: str) -> int",
                f"returns the number of vowels (a, e, i, o, u, in lower or upper case) in {arg}",
                f"    return sum(1 for ch in {arg}.lower() if ch in 'aeiou')",
                (*_CHAR_STEPS, "Add one when the character, taken in lower case, is one of a, e, i, o, u.",
                 "Return the count."),
                (START, r"\bfor\b", r"lower\(|upper\(|casefold\(|AEIOU", RETURN), cases,
                lambda s: len([ch for ch in s if ch in "aeiouAEIOU"]))


def _count_digits(rng: random.Random) -> Task:
    arg = str_arg(rng)
    cases = (("",), ("abc",), ("2024",), ("a1b2c3",), (mixed(rng, "ab 0123456789-x", 6, 14),),
             (mixed(rng, "Z9 .", 3, 9),))
    return Task(f"{rng.choice(['count_digits', 'digit_count', 'num_digits'])}({arg}: str) -> int",
                f"returns how many characters of {arg} are digits (0 to 9)",
                f"    return sum(1 for ch in {arg} if ch.isdigit())",
                (*_CHAR_STEPS, "Add one when the character is a digit.", "Return the count."),
                (START, r"\bfor\b", r"isdigit\(|isnumeric\(|isdecimal\(|0123456789|'0'|\"0\"", RETURN),
                cases, lambda s: len([ch for ch in s if ch in "0123456789"]))


def _count_letter_any_case(rng: random.Random) -> Task:
    arg, c = str_arg(rng), rng.choice("abcdefghijklmnoprstuvwy")
    big = c.upper()
    cases = (("",), (c,), (big * 2,), ("xqz",), (mixed(rng, c + big + "qxz 3", 6, 14),),
             (mixed(rng, big + "Qzx-", 5, 12),))
    return Task(f"{rng.choice(['count_letter', f'count_{c}', 'letter_count'])}({arg}: str) -> int",
                f"returns how many times the letter '{c}' occurs in {arg}, counting '{c}' and '{big}' alike",
                f"    return {arg}.lower().count({c!r})",
                ("Put the string in lower case.", f"Count the occurrences of '{c}' and return that count."),
                (r"lower\(|upper\(|casefold\(", r"\.count\(|=="), cases,
                lambda s: sum(1 for ch in s if ch in (c, big)))


def _drop_letter(rng: random.Random) -> Task:
    arg, c = str_arg(rng), rng.choice("abcdefghijklmnoprstuvwy")
    big = c.upper()
    cases = (("",), (c + big,), ("xqz",), (f"{c}x{big}z",), (mixed(rng, c + big + "qxz 3", 6, 14),))
    return Task(f"{rng.choice(['drop', 'remove', 'strip_letter', 'without'])}_{c}({arg}: str) -> str",
                f"returns {arg} with every '{c}' and every '{big}' removed (the other characters in order)",
                f"    return ''.join(ch for ch in {arg} if ch.lower() != {c!r})",
                ("Go through the characters one by one.",
                 f"Keep a character unless it is '{c}' in either case.",
                 "Join the kept characters, in order, and return them."),
                (r"\bfor\b|replace\(", rf"lower\(|upper\(|casefold\(|['\"]{big}['\"]",
                 r"join\(|\+=|replace\("),
                cases, lambda s: s.replace(c, "").replace(big, ""))


TEMPLATES: dict[int, tuple[Template, ...]] = {
    1: (_arith,),
    2: (_reverse, _total, _extreme, _count_letter, _prefix),
    3: (_count_above, _sum_multiples),
    4: (_count_vowels, _count_digits, _count_letter_any_case, _drop_letter),
}
