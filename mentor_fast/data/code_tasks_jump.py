"""The code ladder's task templates, levels 5-7 (the table is in data/code_tasks.py).

Levels 6 and 7 are built so that the natural first attempt fails a specific test:
- `sorted(xs)[-2]` returns the maximum again on [9, 9, 4] (the second-largest distinct value is 4);
- a double loop over all positions counts each pair twice and pairs a number with itself;
- a run counter updated only when a run ends misses the last run of "aabbb";
- a word weight that counts every non-vowel as a consonant counts the digit of "Ab3", one that
  compares against "aeiou" only misses the capital A;
- a zigzag sum that alternates on the numbers' parity instead of their positions fails [3, 3, 3].
"""

from __future__ import annotations

import itertools
import random

from mentor_fast.data.code_tasks import RETURN, START, WORDS, Task, Template, ints, list_arg, mixed, str_arg

# -- level 5: two stated steps ----------------------------------------------------------------------


def _squares_above(rng: random.Random) -> Task:
    arg, t = list_arg(rng), rng.randint(0, 30)
    cases = (([],), ([t],), ([t + 1],), ([-t - 5, t + 2],), (ints(rng, 6, -10, 20),), (ints(rng, 8, -5, 15),))
    name = rng.choice(["sum_squares_above", "square_sum_above", "big_square_sum"])
    return Task(f"{name}_{t}({arg}: list[int]) -> int",
                f"returns the sum of the squares of the numbers in {arg} that are greater than {t}",
                f"    return sum(x * x for x in {arg} if x > {t})",
                ("Start a total at zero.", "Go through the numbers one by one.",
                 f"Skip the numbers that are not greater than {t}.",
                 "Add the square of each remaining number.",
                 "Return the total."),
                (r"=\s*0\b|sum\(", r"\bfor\b", rf">\s*{t}\b|\b{t}\s*<|>=\s*{t + 1}\b",
                 r"\*\*\s*2|(\w+)\s*\*\s*\1", RETURN), cases, lambda xs: sum(pow(x, 2) for x in xs if x > t))


def _largest_multiple(rng: random.Random) -> Task:
    arg, d = list_arg(rng), rng.randint(2, 12)
    what, tag = ("even number", "even") if d == 2 else (f"multiple of {d}", f"multiple_of_{d}")
    cases = (([],), ([d + 1, 1],), ([d, 5 * d, 3 * d],), ([-d, -1],), (ints(rng, 6, -30, 60),),
             (ints(rng, 8, -60, 60),))

    def logic(xs: list[int]) -> int:
        found = sorted(x for x in xs if x % d == 0)
        return found[-1] if found else -1

    body = f"""
    found = [x for x in {arg} if x % {d} == 0]
    return max(found) if found else -1
"""
    return Task(f"{rng.choice(['largest', 'biggest', 'max'])}_{tag}({arg}: list[int]) -> int",
                f"returns the largest {what} in {arg}, or -1 when {arg} has no {what}", body,
                (f"Keep only the numbers that divide evenly by {d}.",
                 "When none are left, return -1; otherwise return the largest of them."),
                (rf"%\s*{d}\b", r"-\s*1\b"), cases, logic)


# -- level 6: the jump ------------------------------------------------------------------------------


def _kth_distinct(rng: random.Random) -> Task:
    arg, big, k = list_arg(rng), rng.random() < 0.5, rng.choice([2, 2, 3])
    word, nth, sign = ("largest" if big else "smallest"), {2: "second", 3: "third"}[k], (1 if big else -1)
    top = sign * rng.randint(5, 40)
    cases = (([],), ([7],), ([4, 4, 4],), ([top, top, top - 3 * sign, top - 3 * sign, top - 5 * sign],),
             ([1, top, top, 2 * top // 3, top - sign],), (ints(rng, 5, -9, 9) * 2,), (ints(rng, 7, -40, 40),))

    def logic(xs: list[int]) -> int | None:
        rest = list(xs)
        for _ in range(k - 1):  # drop every copy of the current extreme
            rest = [x for x in rest if x != (max(rest) if big else min(rest))] if rest else []
        return (max(rest) if big else min(rest)) if rest else None

    body = f"""
    distinct = sorted(set({arg}){', reverse=True' if big else ''})
    if len(distinct) < {k}:
        return None
    return distinct[{k - 1}]
"""
    names = [f"{nth}_{word}", f"{nth}_{word}_distinct"] + (["runner_up"] if big and k == 2 else [])
    order = "largest to smallest" if big else "smallest to largest"
    return Task(f"{rng.choice(names)}({arg}: list[int]) -> int | None",
                f"returns the {nth}-{word} distinct value in {arg}, or None when {arg} has fewer than {k} "
                "distinct values", body,
                ("Keep each value only once, dropping repeats.", f"Order the remaining values from {order}.",
                 f"When fewer than {k} values remain, return None.", f"Otherwise return the {nth} of them."),
                (r"set\(|not in|!=|fromkeys\(", r"sort|max\(|min\(", r"\bNone\b",
                 rf"\[\s*-?{k}\s*\]|\[\s*{k - 1}\s*\]|max\(|min\("), cases, logic)


def _pair_count(rng: random.Random) -> Task:
    arg, half = list_arg(rng), rng.randint(1, 40)
    t = 2 * half
    cases = (([],), ([t],), ([half],), ([half, half],), ([half, half, half],), ([t - 1, 1, t + 1, -1],),
             (ints(rng, 7, -5, t + 5),))

    def logic(xs: list[int]) -> int:
        return sum(1 for a, b in itertools.combinations(xs, 2) if a + b == t)

    body = f"""
    count = 0
    for i in range(len({arg})):
        for j in range(i + 1, len({arg})):
            if {arg}[i] + {arg}[j] == {t}:
                count += 1
    return count
"""
    name = rng.choice(["count_pairs", "pairs_summing", "pair_count"])
    return Task(f"{name}_to_{t}({arg}: list[int]) -> int",
                f"returns how many pairs of numbers in {arg}, taken at two different positions, add up to "
                f"{t}", body,
                ("Start a count at zero.", "Go through every pair of positions, the first before the second.",
                 f"Add one to the count when the two numbers add up to {t}.", "Return the count."),
                (START, r"\w\s*\+\s*1\b|combinations\(", rf"==\s*{t}\b|\b{t}\s*==|{t}\s*-", RETURN),
                cases, logic)


def _longest_run(rng: random.Random) -> Task:
    arg = str_arg(rng)
    cases = (("",), ("a",), ("abc",), ("aabbb",), ("xxxy",), (mixed(rng, "ab", 6, 12),),
             (mixed(rng, "zzy", 8, 14),))

    def logic(s: str) -> int:
        spans = (j - i for i in range(len(s)) for j in range(i + 1, len(s) + 1) if len(set(s[i:j])) == 1)
        return max(spans, default=0)

    body = f"""
    best = run = 0
    for i, ch in enumerate({arg}):
        run = run + 1 if i > 0 and ch == {arg}[i - 1] else 1
        best = max(best, run)
    return best
"""
    name = rng.choice(["longest_run", "longest_streak", "max_repeat", "max_run", "streak"])
    return Task(f"{name}({arg}: str) -> int",
                f"returns the length of the longest stretch of one character repeated back to back in {arg} "
                "(0 for an empty string)", body,
                ("Keep the length of the current run and of the longest run found so far.",
                 "Go through the characters one by one.",
                 "When a character equals the one before it the current run grows by one, else it restarts.",
                 "After every character keep the longer of the two runs; return the longest run at the end."),
                (r"=\s*[01]\b", r"\bfor\b|groupby\(", r"-\s*1\s*\]|prev|last|==", r"max\(|>"), cases, logic)


# -- level 7: a rule under a made-up name -----------------------------------------------------------


def _word_weight(rng: random.Random) -> Task:
    arg, noun = str_arg(rng), rng.choice(["weight", "heft", "worth", "mass"])
    k1, k2 = rng.sample(range(1, 10), 2)
    cases = (("",), ("a",), ("b",), ("Ab3",), ("hi, you!",), (mixed(rng, "aEbK7 -", 5, 10),),
             (rng.choice(WORDS).capitalize() + str(rng.randint(10, 99)),))

    def logic(s: str) -> int:
        return sum(k1 if ch.lower() in "aeiou" else k2 for ch in s if ch.isascii() and ch.isalpha())

    body = f"""
    total = 0
    for ch in {arg}:
        if ch.lower() in 'aeiou':
            total += {k1}
        elif ch.isalpha():
            total += {k2}
    return total
"""
    definition = (f"The {noun} of a word is the sum of the {noun} of each of its characters: a vowel (a, e, i, o, "
                  f"u, in lower or upper case) has {noun} {k1}, any other letter has {noun} {k2}, and a "
                  f"character that is not a letter (a digit, a space, punctuation) has {noun} 0. ")
    return Task(f"word_{noun}({arg}: str) -> int", f"returns the {noun} of {arg}", body,
                ("Go through the characters one by one.", f"A vowel, in either case, adds {k1}.",
                 f"Any other letter adds {k2}; a character that is not a letter adds nothing.",
                 "Return the total."),
                (r"\bfor\b|sum\(", rf"aeiou|AEIOU|\b{k1}\b", r"isalpha\(|ascii_letters|ascii_lowercase|a-z",
                 RETURN),
                cases, logic, preamble=definition)


def _zigzag(rng: random.Random) -> Task:
    arg, noun, k = list_arg(rng), rng.choice(["zigzag sum", "swing total", "seesaw sum"]), rng.randint(2, 9)
    cases = (([],), ([5],), ([1, 2],), ([3, 3, 3],), ([-4, 6, -1, 2],), (ints(rng, 6),),
             (ints(rng, 9, -30, 30),))
    body = f"""
    total = 0
    for i, x in enumerate({arg}):
        total += x if i % 2 == 0 else -x
    return total * {k}
"""
    definition = (f"The {noun} of a list of numbers is found like this: add its first number, subtract the "
                  f"second, add the third, subtract the fourth, and so on; then multiply the result by {k} "
                  f"(the {noun} of an empty list is 0). ")
    return Task(f"{noun.replace(' ', '_')}({arg}: list[int]) -> int", f"returns the {noun} of {arg}", body,
                ("Go through the numbers together with their positions, counting from zero.",
                 "Add the numbers at even positions and subtract the numbers at odd positions.",
                 f"Multiply the result by {k} and return it."),
                (r"enumerate\(|range\(\s*len|::\s*2|\bfor\b", r"%\s*2|::\s*2|-=|-\s*\w+|\*\s*-1",
                 rf"\*\s*{k}\b|\b{k}\s*\*"), cases,
                lambda xs: k * (sum(xs[0::2]) - sum(xs[1::2])), preamble=definition)


TEMPLATES: dict[int, tuple[Template, ...]] = {
    5: (_squares_above, _largest_multiple),
    6: (_kth_distinct, _longest_run, _pair_count),
    7: (_word_weight, _zigzag),
}
