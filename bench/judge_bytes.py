"""Bytes a judge item sends, its problem inline vs stored (``problem=`` a digest).

Run with the project venv: ``.venv/bin/python bench/judge_bytes.py [--quick] [--json]``;
``bench/judge.py`` runs ``measure`` on its own farm too.

The problem is ``bench/judge.py``'s (10 tests of 2,000 numbers). ``ITEMS`` (40; ``--quick``:
10) Python submissions of it are judged twice through ``Farm.map`` on ``Farm.local`` with one
judge worker: once with the tests in each item, once naming the problem stored by
``Farm.put_problem``. Every chunk the client queues is counted as Redis gets it (its JSON
body), so bytes per item include the chunk's envelope; the stored problem's one upload is
counted apart. Verdicts must agree (all accepted). Reported, never asserted; exits 0.
"""

from __future__ import annotations

import sys
from typing import Any

from benchlib import emit, machine, parse_args

from farm.client import Farm
from farm.judge.problems import Problem
from farm.models.judge import Verdict
from farm.sandbox.catalog import build_image

ITEMS, QUICK_ITEMS = 40, 10
SOURCE = (
    "# submission {n}\nimport sys\nn, *xs = map(int, sys.stdin.read().split())\n"
    "print(sum(xs[:n]))\n"
)


def _mapped(farm: Farm, items: list[dict[str, Any]]) -> tuple[int, int]:
    """(bytes of the chunks queued, items accepted) of one map of ``items``."""
    sent: list[int] = []
    queue_chunk = farm.broker.queue_chunk

    def counted(queue: str, body: str) -> tuple[int, int]:
        sent.append(len(body.encode()))
        return queue_chunk(queue, body)

    farm.broker.queue_chunk = counted  # type: ignore[method-assign]
    try:
        records = list(farm.map(items, image="judge", ordered=False, retries=1))
    finally:
        del farm.broker.queue_chunk
    accepted = sum(r.judge is not None and r.judge.verdict == Verdict.AC for r in records)
    return sum(sent), accepted


def measure(
    farm: Farm, tests: list[dict[str, str]], limits: dict[str, Any], count: int
) -> dict[str, Any]:
    """Bytes per item of ``count`` submissions judged with their tests inline, then stored."""
    sources = [SOURCE.format(n=n) for n in range(count)]
    inline = [
        {"id": n, "language": "python3", "source": s, "tests": tests, "limits": limits}
        for n, s in enumerate(sources)
    ]
    inline_bytes, inline_ok = _mapped(farm, inline)
    problem = Problem.model_validate({"tests": tests, "limits": limits})
    digest = farm.put_problem(problem, again=True)
    stored = [
        {"id": n, "language": "python3", "source": s, "problem": digest}
        for n, s in enumerate(sources)
    ]
    stored_bytes, stored_ok = _mapped(farm, stored)
    return {
        "items": count,
        "inline_bytes_per_item": inline_bytes / count,
        "stored_bytes_per_item": stored_bytes / count,
        "problem_bytes_once": len(problem.canonical),
        "ratio": inline_bytes / stored_bytes,
        "accepted": {"inline": inline_ok, "stored": stored_ok},
    }


def lines(result: dict[str, Any]) -> list[str]:
    return [
        f"bytes per item, {result['items']} items: inline {result['inline_bytes_per_item']:,.0f}, "
        f"stored {result['stored_bytes_per_item']:,.0f} ({result['ratio']:,.0f}x fewer; the "
        f"problem's {result['problem_bytes_once']:,} bytes sent once), accepted "
        f"{result['accepted']['inline']} and {result['accepted']['stored']}",
    ]


def main(argv: list[str] | None = None) -> int:
    from judge import LIMITS, problem_tests  # bench/judge.py's problem

    args = parse_args(__doc__ or "", argv)
    build_image("judge")
    with Farm.local(images={"judge": 1}) as farm:
        result = measure(farm, problem_tests(), LIMITS, QUICK_ITEMS if args.quick else ITEMS)
    text = "\n".join([f"bench/judge_bytes.py on {machine()}", *lines(result)])
    return emit(text, {"machine": machine(), **result}, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
