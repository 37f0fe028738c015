"""Checkers: does a program's output match the expected output of a test?

Run by the judge's runner (``judging``) inside the box, right after each test, so that "stop
at the first failing test" needs no round trip. Names: ``exact`` (byte for byte), ``lines``
(trailing whitespace of each line and trailing empty lines ignored), ``tokens`` (any
whitespace between tokens), ``float:ABS[:REL]`` (tokens; numbers within ABS absolutely or REL
relatively), ``none`` (any output: only how the run ended counts). A special judge (the
user's Python) never runs here: see ``farm.worker.judge_items``.
"""

from __future__ import annotations

import math

NAMES = ("exact", "lines", "tokens", "float", "none")


class CheckerError(ValueError):
    """A checker name this module does not know, or a float checker with bad tolerances."""


def parse(name: str) -> tuple[str, float, float]:
    """``name`` as (kind, absolute, relative tolerance); ``CheckerError`` when unknown."""
    kind, _, rest = name.partition(":")
    if kind not in NAMES or (rest and kind != "float"):
        raise CheckerError(
            f"unknown checker {name!r} (known: exact, lines, tokens, float:ABS[:REL], none)"
        )
    if kind != "float":
        return kind, 0.0, 0.0
    parts = rest.split(":") if rest else ["1e-6"]
    try:
        absolute = float(parts[0])
        relative = float(parts[1]) if len(parts) > 1 else 0.0
    except ValueError:
        raise CheckerError(f"bad tolerances in checker {name!r}") from None
    if len(parts) > 2 or not (absolute >= 0 and relative >= 0):
        raise CheckerError(f"bad tolerances in checker {name!r}")
    return kind, absolute, relative


def check(name: str, expected: bytes, actual: bytes) -> tuple[bool, str]:
    """Whether ``actual`` passes against ``expected``, and, when not, a short reason."""
    kind, absolute, relative = parse(name)
    if kind == "none":  # any output: the run alone is judged (Judge0 without expected_output)
        return True, ""
    if kind == "exact":
        return (True, "") if expected == actual else (False, _first_difference(expected, actual))
    if kind == "lines":
        want, got = _lines(expected), _lines(actual)
        for number, (a, b) in enumerate(zip(want, got), 1):
            if a != b:
                return False, f"line {number} differs"
        if len(want) != len(got):
            return False, f"expected {len(want)} lines, got {len(got)}"
        return True, ""
    want_tokens, got_tokens = expected.split(), actual.split()
    if len(want_tokens) != len(got_tokens):
        return False, f"expected {len(want_tokens)} tokens, got {len(got_tokens)}"
    for number, (a, b) in enumerate(zip(want_tokens, got_tokens), 1):
        if a == b:
            continue
        if kind == "float" and _close(a, b, absolute, relative):
            continue
        return False, f"token {number} differs: expected {_clip(a)}, got {_clip(b)}"
    return True, ""


def _lines(data: bytes) -> list[bytes]:
    lines = [line.rstrip() for line in data.split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _close(want: bytes, got: bytes, absolute: float, relative: float) -> bool:
    try:
        a, b = float(want), float(got)
    except ValueError:
        return False
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(absolute, relative * abs(a))


def _first_difference(expected: bytes, actual: bytes) -> str:
    for index, (a, b) in enumerate(zip(expected, actual)):
        if a != b:
            return f"byte {index} differs"
    return f"expected {len(expected)} bytes, got {len(actual)}"


def _clip(token: bytes) -> str:
    text = token.decode(errors="replace")
    return repr(text if len(text) <= 40 else text[:37] + "...")
