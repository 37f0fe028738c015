"""What a problem's checker or interactor said: testlib's exit codes or the Kattis format's.

testlib (Codeforces, Polygon): 0 accepted, 1 wrong answer, 2 presentation error (and 4, 8:
testlib's "dirt" and unexpected end of file, both a presentation error unless built
otherwise), 3 the checker's own failure, 7 points (``points X message`` on stderr). Kattis
output validators: 42 accepted, 43 wrong answer, anything else a judge error; the message in
``judgemessage.txt``, a score in ``score.txt``. farm has no PE: it is WA with a message that
says so, as Codeforces shows it. A failure of the problem's program is ``IE`` of kind
``input`` (the problem's fault, never farm's). Points are the share of the test, 0 to 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..wire.protocol import Verdict

MESSAGE_BYTES = 2048  # of what a checker said, kept for the test's message


@dataclass
class Said:
    """A checker's or interactor's word on a test: ``AC``, ``WA`` or ``IE`` (it failed)."""

    verdict: Verdict
    points: float
    message: str


def clip(text: str, limit: int = MESSAGE_BYTES) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _died(who: str, signal: int) -> Said:
    return Said("IE", 0.0, f"the {who} died of signal {signal}")


def _share(text: str) -> float | None:
    """A number as a test's share of points: within [0, 1] (more counts as the whole test)."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return min(value, 1.0)


def testlib(exit_code: int | None, signal: int | None, stderr: str, who: str = "checker") -> Said:
    """A testlib checker's or interactor's verdict from how it ended and its stderr."""
    message = clip(stderr)
    if signal is not None:
        return _died(who, signal)
    if exit_code == 0:
        return Said("AC", 1.0, message)
    if exit_code == 1:
        return Said("WA", 0.0, message)
    if exit_code in (2, 4, 8):
        return Said(
            "WA", 0.0, f"presentation error: {message}" if message else "presentation error"
        )
    if exit_code == 3:
        return Said("IE", 0.0, f"the {who} failed: {message}" if message else f"the {who} failed")
    if exit_code == 7:
        words = message.split(None, 2)
        if len(words) >= 2 and words[0] == "points":
            points = _share(words[1])
            if points is not None:
                return Said("AC" if points >= 1.0 else "WA", points, message)
        return Said("IE", 0.0, f"the {who} gave points that are not a number: {message!r}")
    return Said("IE", 0.0, f"the {who} exited with code {exit_code}, not a testlib verdict")


def kattis(
    exit_code: int | None,
    signal: int | None,
    feedback: str,
    score: str | None,
    who: str = "output validator",
) -> Said:
    """A Kattis output validator's verdict: its exit code, ``judgemessage.txt`` and, when it
    wrote one, ``score.txt`` (the accepted test's share of points; 1 without it)."""
    message = clip(feedback)
    if signal is not None:
        return _died(who, signal)
    if exit_code == 42:
        points = 1.0 if score is None or not score.strip() else _share(score.strip())
        if points is None:
            return Said("IE", 0.0, f"the {who} wrote a score that is not a number: {score!r}")
        return Said("AC", points, message)
    if exit_code == 43:
        return Said("WA", 0.0, message)
    return Said("IE", 0.0, f"the {who} exited with code {exit_code} (42 accepts, 43 rejects)")


def said(
    protocol: str,
    exit_code: int | None,
    signal: int | None,
    stderr: str,
    feedback: str,
    score: str | None,
    who: str,
) -> Said:
    """The verdict of a program of ``protocol`` (``testlib`` or ``kattis``)."""
    if protocol == "kattis":
        return kattis(exit_code, signal, feedback, score, who)
    return testlib(exit_code, signal, stderr, who)
