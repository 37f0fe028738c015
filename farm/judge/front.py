"""``Farm.judge``: one submission judged through the map engine (a map of one judge item)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from farm.judge import JUDGE_IMAGE
from farm.models.batch import BatchRecord
from farm.models.judge import JudgeResult, Verdict


class Mapper(Protocol):
    """What judging one submission needs of a farm (``Farm`` is one): its map engine."""

    def map(
        self, items: Iterable[Any], *, image: str = ..., retries: int = ...
    ) -> Iterable[BatchRecord]: ...


def judge_one(
    farm: Mapper,
    language: str,
    source: str,
    tests: Sequence[Mapping[str, Any]],
    *,
    image: str = JUDGE_IMAGE,
    retries: int = 1,
    **options: Any,
) -> JudgeResult:
    """The verdict of ``source`` on ``tests``; an item farm refused or could not judge is
    ``IE`` with the reason (``kind`` says whether retrying could help)."""
    item = {"id": 0, "language": language, "source": source, "tests": list(tests), **options}
    record = next(iter(farm.map([item], image=image, retries=retries)))
    if record.judge is not None:
        return record.judge
    return JudgeResult(verdict=Verdict.IE, kind=record.kind, message=record.message or "")
