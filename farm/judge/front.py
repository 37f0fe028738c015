"""``Farm.judge``: one submission judged through the map engine (a map of one judge item)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from farm.judge import JUDGE_IMAGE
from farm.models.judge import JudgeResult, Verdict

if TYPE_CHECKING:
    from farm.client.farm import Farm


def judge_one(
    farm: Farm,
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
