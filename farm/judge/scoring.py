"""Subtasks and points: a judge item's ``groups`` scored from its tests' verdicts, by the
worker, which holds the item's problem, after the kernel's result (the kernel knows nothing
of groups). ``min`` is IOI's all or nothing, ``sum`` a share per test passed; a group scores
0 unless each group it depends on passed whole (CMS, Polygon). A checker program's partial
points count as a share of a test: ``min`` takes the lowest share (CMS's GroupMin), ``sum``
their mean. An ``IE`` result (farm's failure) is never scored.
"""

from __future__ import annotations

from collections.abc import Sequence

from farm.models.judge import GroupScore, JudgeResult, TestGroup, Verdict, group_order

PLACES = 6  # scores are rounded so that thirds add up to whole points


def _share(points: float | None, verdict: Verdict) -> float:
    """A test's share of its points: what its checker gave it (a testlib checker's points, a
    Kattis validator's score), else all for AC and none otherwise."""
    if points is not None:
        return min(max(points, 0.0), 1.0)
    return 1.0 if verdict == Verdict.AC else 0.0


def scored(result: JudgeResult, groups: Sequence[TestGroup] | None) -> JudgeResult:
    """``result`` with its ``score``, ``max_score`` and each group's, in the groups' order;
    as it is without groups or when farm failed to judge it. A test that did not run (none
    runs after a compile error) fails with the submission's verdict."""
    if not groups or result.verdict == Verdict.IE:
        return result
    verdicts = {test.index: test.verdict for test in result.tests}
    shares = {test.index: _share(test.points, test.verdict) for test in result.tests}
    missing = result.verdict if result.verdict != Verdict.AC else Verdict.IE
    whole: dict[str, bool] = {}  # name -> every test passed, and every dependency whole
    scores: dict[str, GroupScore] = {}
    for group in group_order(groups):
        ran = [(index, verdicts.get(index, missing)) for index in sorted(set(group.tests))]
        failed = [(index, verdict) for index, verdict in ran if verdict != Verdict.AC]
        blocked_by = next((name for name in group.depends_on if not whole[name]), None)
        whole[group.name] = not failed and blocked_by is None
        earned = [shares.get(index, 0.0) for index, _ in ran]
        if blocked_by is not None:
            points = 0.0
        elif group.scoring == "min":
            points = group.points * min(earned)
        else:
            points = group.points * sum(earned) / len(earned)
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
