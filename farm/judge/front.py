"""``Farm.judge``: one submission judged through the map engine (a map of one judge item), on
its tests or on a problem: a ``Problem``, a stored one's digest, or a package's directory."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from farm.errors import InvalidRequest
from farm.judge import JUDGE_IMAGE
from farm.judge.problems import DIGEST, Problem
from farm.models.batch import BatchRecord
from farm.models.judge import JudgeResult, Verdict

ProblemRef = Problem | str | os.PathLike[str]


class Mapper(Protocol):
    """What judging one submission needs of a farm (``Farm`` is one): its map engine."""

    def map(
        self, items: Iterable[Any], *, image: str = ..., retries: int = ...
    ) -> Iterable[BatchRecord]: ...


def resolve(problem: ProblemRef) -> Problem | str:
    """A ``Problem`` or a digest as it is; a directory read as a package (``packages``)."""
    if isinstance(problem, Problem):
        return problem
    if isinstance(problem, str) and DIGEST.match(problem):
        return problem
    path = Path(problem)
    if not path.is_dir():
        raise InvalidRequest(
            f"problem {str(problem)!r} is neither a Problem, a digest ('sha256:...') nor a "
            "package's directory"
        )
    from farm.judge.packages import read_package

    return read_package(path)


def judge_one(
    farm: Mapper,
    language: str,
    source: str,
    tests: Sequence[Mapping[str, Any]] | None = None,
    *,
    problem: ProblemRef | None = None,
    image: str = JUDGE_IMAGE,
    retries: int = 1,
    **options: Any,
) -> JudgeResult:
    """The verdict of ``source`` on ``tests`` or ``problem``; an item farm refused or could
    not judge is ``IE`` with the reason (``kind`` says whether retrying could help)."""
    item: dict[str, Any] = {"id": 0, "language": language, "source": source, **options}
    if problem is not None:
        if tests is not None:
            raise InvalidRequest("give tests or a problem, not both")
        item["problem"] = resolve(problem)
    else:
        item["tests"] = list(tests or [])
    record = next(iter(farm.map([item], image=image, retries=retries)))
    if record.judge is not None:
        return record.judge
    return JudgeResult(verdict=Verdict.IE, kind=record.kind, message=record.message or "")
