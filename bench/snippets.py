"""Deterministic snippets "with checks": what a sweep of model-written code looks like.

``snippets(n)`` returns ``n`` items ``{"id": ..., "code": ...}``, the same on every call and
every machine: small functions plus asserts (strings, arithmetic, sorting, recursion,
comprehensions, small classes), self-contained stdlib Python that runs in well under 100 ms.
The mix is fixed by the index: one in ten fails an assert (its expected value is wrong by a
little, as a wrong model answer would be), one in forty raises (``KeyError``,
``ZeroDivisionError``, ``IndexError``, ``ValueError``, ``TypeError``), the rest pass.

Expected values are computed here by an independent route (``sorted``, ``math``,
``collections``), so the asserts of a passing snippet hold by construction.

Run as a program (``.venv/bin/python bench/snippets.py``), it executes the snippets in this
process and prints the mix and the slowest one, a check that the generator keeps its promises.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from textwrap import dedent
from typing import Any

FAIL_EVERY = 10  # index % FAIL_EVERY == FAIL_AT fails an assert
FAIL_AT = 7
RAISE_EVERY = 40  # index % RAISE_EVERY == RAISE_AT raises instead
RAISE_AT = 13

# A family builds (code, checks) from a seeded RNG and whether this one must fail; each check
# is "expression == expected", with the expected value computed here.
Family = Callable[[random.Random, bool], tuple[str, list[tuple[str, Any]]]]


def _off(value: Any, wrong: bool) -> Any:
    """A plausible wrong answer when ``wrong``: off by one, a letter or an element."""
    if not wrong:
        return value
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return value[1:] + value[:1] if len(value) > 1 else [*value, 0]
    if isinstance(value, dict):
        return {**value, "extra": 1}
    if isinstance(value, tuple):
        return (*value, 0)
    raise TypeError(f"no wrong answer for {type(value).__name__}")


# --- families -------------------------------------------------------------------------------

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "level",
    "radar",
    "python",
    "sorting",
    "kernel",
    "farm",
    "queue",
    "noon",
    "sandbox",
]


def reverse_words(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    words = rng.sample(WORDS, 4)
    text = " ".join(words)
    code = '''
        def reverse_words(s):
            """Reverse the order of the words, then the letters of each."""
            return " ".join(w[::-1] for w in reversed(s.split()))
    '''
    expected = " ".join(w[::-1] for w in words[::-1])
    return code, [(f"reverse_words({text!r})", _off(expected, wrong))]


def vowels(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    text = " ".join(rng.choices(WORDS, k=6))
    code = """
        def count_vowels(s):
            return sum(1 for ch in s.lower() if ch in "aeiou")

        def is_palindrome(s):
            t = [ch for ch in s.lower() if ch.isalnum()]
            return t == t[::-1]
    """
    word = rng.choice(WORDS)
    return code, [
        (f"count_vowels({text!r})", _off(sum(text.count(v) for v in "aeiou"), wrong)),
        (f"is_palindrome({word!r})", word == word[::-1]),
    ]


def caesar(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    word, shift = rng.choice(WORDS), rng.randint(1, 25)
    code = """
        def caesar(s, k):
            out = []
            for ch in s:
                if ch.isalpha():
                    out.append(chr((ord(ch) - 97 + k) % 26 + 97))
                else:
                    out.append(ch)
            return "".join(out)
    """
    table = str.maketrans(
        "abcdefghijklmnopqrstuvwxyz",
        "".join(chr((i + shift) % 26 + 97) for i in range(26)),
    )
    expected = word.translate(table)
    return code, [
        (f"caesar({word!r}, {shift})", _off(expected, wrong)),
        (f"caesar(caesar({word!r}, {shift}), {26 - shift})", word),
    ]


def gcd_lcm(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    a, b = rng.randint(12, 5000), rng.randint(12, 5000)
    code = """
        def gcd(a, b):
            while b:
                a, b = b, a % b
            return a

        def lcm(a, b):
            return a * b // gcd(a, b)
    """
    return code, [
        (f"gcd({a}, {b})", math.gcd(a, b)),
        (f"lcm({a}, {b})", _off(math.lcm(a, b), wrong)),
    ]


def primes(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    n = rng.randint(50, 3000)
    code = """
        def primes_upto(n):
            sieve = [True] * (n + 1)
            sieve[0] = sieve[1] = False
            for i in range(2, int(n ** 0.5) + 1):
                if sieve[i]:
                    sieve[i * i :: i] = [False] * len(range(i * i, n + 1, i))
            return [i for i, p in enumerate(sieve) if p]
    """
    found = [p for p in range(2, n + 1) if all(p % d for d in range(2, math.isqrt(p) + 1))]
    return code, [
        (f"len(primes_upto({n}))", _off(len(found), wrong)),
        (f"primes_upto({n})[:5]", found[:5]),
    ]


def fibonacci(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    n = rng.randint(10, 80)
    code = """
        def fib(n):
            a, b = 0, 1
            for _ in range(n):
                a, b = b, a + b
            return a

        def fact(n):
            return 1 if n <= 1 else n * fact(n - 1)
    """
    phi = (1 + 5**0.5) / 2
    m = n % 15
    fib_small = round(phi**m / 5**0.5)
    return code, [
        (f"fib({m})", fib_small),
        (f"fib({n + 2}) - fib({n + 1}) - fib({n})", 0),
        (f"fact({m})", _off(math.factorial(m), wrong)),
    ]


def sorting(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    data = [rng.randint(-100, 100) for _ in range(rng.randint(8, 60))]
    code = """
        def insertion_sort(xs):
            xs = list(xs)
            for i in range(1, len(xs)):
                key, j = xs[i], i - 1
                while j >= 0 and xs[j] > key:
                    xs[j + 1] = xs[j]
                    j -= 1
                xs[j + 1] = key
            return xs

        def merge_sort(xs):
            if len(xs) <= 1:
                return list(xs)
            mid = len(xs) // 2
            left, right = merge_sort(xs[:mid]), merge_sort(xs[mid:])
            out, i, j = [], 0, 0
            while i < len(left) and j < len(right):
                if left[i] <= right[j]:
                    out.append(left[i]); i += 1
                else:
                    out.append(right[j]); j += 1
            return out + left[i:] + right[j:]
    """
    expected = sorted(data)
    return code, [
        (f"insertion_sort({data})", _off(expected, wrong)),
        (f"merge_sort({data})", expected),
    ]


def sort_by_key(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    people = [(rng.choice(WORDS), rng.randint(18, 90)) for _ in range(rng.randint(4, 12))]
    code = """
        def by_age_then_name(people):
            return [name for name, age in sorted(people, key=lambda p: (-p[1], p[0]))]
    """
    expected = [name for name, _ in sorted(people, key=lambda p: (-p[1], p[0]))]
    return code, [(f"by_age_then_name({people})", _off(expected, wrong))]


def recursion(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    disks = rng.randint(3, 12)
    a, b, c, d = (rng.randint(0, 9) for _ in range(4))
    nested = [a, [b, [c, []]], d]
    code = """
        def hanoi(n, a="A", b="B", c="C", moves=None):
            moves = [] if moves is None else moves
            if n:
                hanoi(n - 1, a, c, b, moves)
                moves.append((a, c))
                hanoi(n - 1, b, a, c, moves)
            return moves

        def flatten(xs):
            out = []
            for x in xs:
                out.extend(flatten(x) if isinstance(x, list) else [x])
            return out
    """
    return code, [
        (f"len(hanoi({disks}))", _off(2**disks - 1, wrong)),
        (f"flatten({nested})", [a, b, c, d]),
    ]


def binary_search(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    xs = sorted(rng.sample(range(1000), rng.randint(10, 200)))
    target = rng.choice(xs)
    code = """
        def bsearch(xs, x, lo=0, hi=None):
            hi = len(xs) - 1 if hi is None else hi
            if lo > hi:
                return -1
            mid = (lo + hi) // 2
            if xs[mid] == x:
                return mid
            if xs[mid] < x:
                return bsearch(xs, x, mid + 1, hi)
            return bsearch(xs, x, lo, mid - 1)
    """
    return code, [
        (f"bsearch({xs}, {target})", _off(xs.index(target), wrong)),
        (f"bsearch({xs}, 1001)", -1),
    ]


def word_freq(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    words = rng.choices(WORDS[:6], k=rng.randint(5, 30))
    text = " ".join(words)
    code = """
        def word_freq(s):
            words = s.split()
            return {w: words.count(w) for w in sorted(set(words))}

        def inverted(d):
            out = {}
            for k, v in d.items():
                out.setdefault(v, []).append(k)
            return {k: sorted(v) for k, v in out.items()}
    """
    freq = dict(sorted(Counter(words).items()))
    inv: dict[int, list[str]] = {}
    for word, count in freq.items():
        inv.setdefault(count, []).append(word)
    return code, [
        (f"word_freq({text!r})", _off(freq, wrong)),
        (f"inverted(word_freq({text!r}))", {k: sorted(v) for k, v in inv.items()}),
    ]


def comprehensions(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    rows, cols = rng.randint(2, 6), rng.randint(2, 6)
    matrix = [[rng.randint(0, 9) for _ in range(cols)] for _ in range(rows)]
    n = rng.randint(5, 60)
    code = """
        def transpose(m):
            return [[row[i] for row in m] for i in range(len(m[0]))]

        def even_squares(n):
            return [i * i for i in range(n) if i % 2 == 0]
    """
    return code, [
        (f"transpose({matrix})", [list(c) for c in zip(*matrix, strict=True)]),
        (f"sum(even_squares({n}))", _off(sum(i * i for i in range(0, n, 2)), wrong)),
    ]


def stack_class(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    text = "".join(rng.choices("()[]{}", k=rng.randint(4, 16)))
    code = """
        class Stack:
            def __init__(self):
                self._items = []

            def push(self, x):
                self._items.append(x)

            def pop(self):
                return self._items.pop()

            def __len__(self):
                return len(self._items)

        def balanced(s):
            pairs, st = {")": "(", "]": "[", "}": "{"}, Stack()
            for ch in s:
                if ch in "([{":
                    st.push(ch)
                elif not len(st) or st.pop() != pairs[ch]:
                    return False
            return len(st) == 0
    """
    expected = text
    for _ in range(len(text)):
        expected = expected.replace("()", "").replace("[]", "").replace("{}", "")
    return code, [
        (f"balanced({text!r})", _off(expected == "", wrong)),
        ("balanced('([]{})')", True),
    ]


def account_class(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    ops = [rng.randint(-50, 100) for _ in range(rng.randint(3, 15))]
    code = """
        class Account:
            def __init__(self, balance=0):
                self.balance = balance
                self.refused = 0

            def apply(self, amount):
                if self.balance + amount < 0:
                    self.refused += 1
                    return False
                self.balance += amount
                return True

        def run(amounts):
            acct = Account()
            for amount in amounts:
                acct.apply(amount)
            return acct
    """
    balance, refused = 0, 0
    for amount in ops:
        if balance + amount < 0:
            refused += 1
        else:
            balance += amount
    return code, [
        (f"run({ops}).balance", _off(balance, wrong)),
        (f"run({ops}).refused", refused),
    ]


def vector_class(rng: random.Random, wrong: bool) -> tuple[str, list[tuple[str, Any]]]:
    (a, b), (c, d) = (
        (rng.randint(-9, 9), rng.randint(-9, 9)),
        (rng.randint(-9, 9), rng.randint(-9, 9)),
    )
    code = """
        class Vec:
            def __init__(self, x, y):
                self.x, self.y = x, y

            def __add__(self, other):
                return Vec(self.x + other.x, self.y + other.y)

            def __eq__(self, other):
                return (self.x, self.y) == (other.x, other.y)

            def dot(self, other):
                return self.x * other.x + self.y * other.y

            def as_tuple(self):
                return (self.x, self.y)
    """
    return code, [
        (f"(Vec({a}, {b}) + Vec({c}, {d})).as_tuple()", _off((a + c, b + d), wrong)),
        (f"Vec({a}, {b}).dot(Vec({c}, {d}))", a * c + b * d),
    ]


FAMILIES: list[Family] = [
    reverse_words,
    vowels,
    caesar,
    gcd_lcm,
    primes,
    fibonacci,
    sorting,
    sort_by_key,
    recursion,
    binary_search,
    word_freq,
    comprehensions,
    stack_class,
    account_class,
    vector_class,
]

# Appended to the snippets that raise: each a mistake a model makes (a missing key, an empty
# divisor, an index past the end, a bad parse, a wrong type).
RAISERS = [
    'config = {"depth": 3}\nconfig["width"]',
    "values = []\nsum(values) / len(values)",
    "items = [1, 2, 3]\nitems[len(items)]",
    'int("12a")',
    '"total: " + 3',
]


def snippet(index: int) -> dict[str, Any]:
    """The ``index``-th snippet; its outcome depends on the index alone (see the module doc)."""
    family = FAMILIES[index % len(FAMILIES)]
    rng = random.Random(index)
    fails = index % FAIL_EVERY == FAIL_AT
    raises = index % RAISE_EVERY == RAISE_AT
    body, checks = family(rng, fails)
    lines = [dedent(body).strip(), ""]
    lines += [f"assert {expr} == {expected!r}, {expr!r}" for expr, expected in checks]
    if raises:
        lines.append(RAISERS[(index // RAISE_EVERY) % len(RAISERS)])
    return {"id": f"s{index:03d}-{family.__name__}", "code": "\n".join(lines) + "\n"}


def snippets(n: int = 200) -> list[dict[str, Any]]:
    """``n`` snippets, the same on every call: ids ``sNNN-family``, code self-contained."""
    return [snippet(i) for i in range(n)]


def outcome(code: str) -> str:
    """``pass`` or the name of the exception the code raised, running it in a fresh dict."""
    try:
        exec(code, {"__name__": "__snippet__"})
    except Exception as exc:
        return type(exc).__name__
    return "pass"


def main() -> int:
    items = snippets()
    outcomes: Counter[str] = Counter()
    slowest = (0.0, "")
    for item in items:
        t0 = time.perf_counter()
        outcomes[outcome(item["code"])] += 1
        slowest = max(slowest, (time.perf_counter() - t0, item["id"]))
    mix = ", ".join(f"{name} {count}" for name, count in outcomes.most_common())
    print(f"{len(items)} snippets, {len(FAMILIES)} families: {mix}")
    print(f"slowest in this process: {slowest[1]} {slowest[0] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
