"""Subtasks and points: a judge item's ``groups`` scored from its tests' verdicts, on the
client, after the worker's result (the kernel knows nothing of groups). ``min`` is IOI's all
or nothing, ``sum`` a share per test passed; a group scores 0 unless each group it depends
on passed whole (CMS, Polygon). An ``IE`` result (farm's failure) is never scored.
"""

from __future__ import annotations

from collections.abc import Sequence

from farm.models.judge import GroupScore, JudgeResult, TestGroup, Verdict, group_order

PLACES = 6  # scores are rounded so that thirds add up to whole points


def scored(result: JudgeResult, groups: Sequence[TestGroup] | None) -> JudgeResult:
    """``result`` with its ``score``, ``max_score`` and each group's, in the groups' order;
    as it is without groups or when farm failed to judge it. A test that did not run (none
    runs after a compile error) fails with the submission's verdict."""
    if not groups or result.verdict == Verdict.IE:
        return result
    verdicts = {test.index: test.verdict for test in result.tests}
    missing = result.verdict if result.verdict != Verdict.AC else Verdict.IE
    whole: dict[str, bool] = {}  # name -> every test passed, and every dependency whole
    scores: dict[str, GroupScore] = {}
    for group in group_order(groups):
        ran = [(index, verdicts.get(index, missing)) for index in sorted(set(group.tests))]
        failed = [(index, verdict) for index, verdict in ran if verdict != Verdict.AC]
        blocked_by = next((name for name in group.depends_on if not whole[name]), None)
        whole[group.name] = not failed and blocked_by is None
        if blocked_by is not None or (failed and group.scoring == "min"):
            points = 0.0
        else:
            points = group.points * (len(ran) - len(failed)) / len(ran)
        scores[group.name] = GroupScore(
            name=group.name,
            points=group.points,
            scored=round(points, PLACES),
            verdict=failed[0][1] if failed else Verdict.AC,
            test=failed[0][0] if failed else None,
            blocked_by=blocked_by,
        )
    ordered = [scores[group.name] for group in groups]
    return result.model_copy(
        update={
            "score": round(sum(group.scored for group in ordered), PLACES),
            "max_score": round(sum(group.points for group in groups), PLACES),
            "groups": ordered,
        }
    )
