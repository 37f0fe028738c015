"""Subtasks and points (``farm.judge.scoring``): groups scored from per-test verdicts, and
groups refused before anything runs. No Docker: the verdicts are made up."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from farm.judge.scoring import scored
from farm.judge.specs import judge_spec
from farm.models.batch import BatchItem, BatchRecord
from farm.models.judge import JudgeResult, TestGroup, TestResult, Verdict
from farm.sweep import SweepSummary

TESTS = [{"stdin": f"{n}\n", "expected": f"{n}\n"} for n in range(6)]


def judged(*verdicts: str) -> JudgeResult:
    tests = [TestResult(index=i, verdict=Verdict(v)) for i, v in enumerate(verdicts)]
    first = next((t.verdict for t in tests if t.verdict != Verdict.AC), Verdict.AC)
    return JudgeResult(verdict=first, tests=tests)


def groups(*given: dict[str, Any]) -> list[TestGroup]:
    return [TestGroup.model_validate(group) for group in given]


def judge_item(**extra: Any) -> dict[str, Any]:
    return {"id": 1, "language": "python3", "source": "print(1)", "tests": TESTS, **extra}


def test_a_min_group_scores_only_when_every_test_passes() -> None:
    given = groups(
        {"name": "small", "points": 30, "tests": "0-2"},
        {"name": "large", "points": 70, "tests": [3, "4-5"]},
    )
    result = scored(judged("AC", "AC", "AC", "AC", "TLE", "AC"), given)
    assert (result.score, result.max_score) == (30, 100)
    assert result.groups is not None
    small, large = result.groups
    assert (small.scored, small.verdict, small.test) == (30, Verdict.AC, None)
    assert (large.scored, large.verdict, large.test) == (0, Verdict.TLE, 4)


def test_a_sum_group_scores_its_share_of_tests_passed() -> None:
    given = groups({"name": "all", "points": 100, "tests": "0-2", "scoring": "sum"})
    result = scored(judged("AC", "WA", "AC"), given)
    assert result.score == pytest.approx(66.666667) and result.max_score == 100
    assert result.groups is not None and result.groups[0].verdict == Verdict.WA


def test_a_group_scores_nothing_unless_its_dependencies_passed_whole() -> None:
    given = groups(  # given out of order: "b" is scored after what it depends on
        {"name": "b", "points": 50, "tests": [2], "depends_on": ["a"]},
        {"name": "a", "points": 20, "tests": [0, 1], "scoring": "sum"},
        {"name": "c", "points": 30, "tests": [3], "depends_on": ["b"]},
    )
    result = scored(judged("AC", "WA", "AC", "AC"), given)
    assert result.groups is not None
    b, a, c = result.groups
    assert (a.scored, b.scored, c.scored) == (10, 0, 0)
    assert (b.blocked_by, b.verdict, c.blocked_by) == ("a", Verdict.AC, "b")
    assert result.score == 10 and result.max_score == 100
    everything = scored(judged("AC", "AC", "AC", "AC"), given)
    assert everything.score == everything.max_score == 100


def test_a_zero_point_samples_group_still_gates_its_dependents() -> None:
    given = groups(
        {"name": "samples", "points": 0, "tests": [0]},
        {"name": "main", "points": 100, "tests": [1], "depends_on": ["samples"]},
    )
    result = scored(judged("WA", "AC"), given)
    assert result.score == 0 and result.groups is not None
    assert result.groups[1].blocked_by == "samples"


def test_a_compile_error_scores_zero_and_farms_failures_are_not_scored() -> None:
    given = groups({"name": "all", "points": 10, "tests": [0, 1]})
    compile_error = scored(JudgeResult(verdict=Verdict.CE), given)
    assert compile_error.score == 0 and compile_error.groups is not None
    assert compile_error.groups[0].verdict == Verdict.CE
    assert compile_error.groups[0].test == 0
    assert scored(JudgeResult(verdict=Verdict.IE), given).score is None
    assert scored(judged("AC"), None).score is None  # no groups: no score, as before


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ([{"name": "a", "points": 1, "tests": [0, 6]}], "groups['a'].tests: [6] out of range"),
        ([{"name": "a", "points": 1, "tests": "4-9"}], "[6, 7, 8, 9] out of range"),
        ([{"name": "a", "points": 1, "tests": [-1]}], "[-1] out of range"),
        ([{"name": "a", "points": 1, "tests": "3-1"}], "the range '3-1' is empty"),
        ([{"name": "a", "points": 1, "tests": []}], "at least 1 item"),
        ([{"name": "a", "points": -1, "tests": [0]}], "greater than or equal to 0"),
        (
            [{"name": "a", "points": 1, "tests": [0], "depends_on": ["z"]}],
            "groups['a'].depends_on: no group named 'z'",
        ),
        (
            [
                {"name": "a", "points": 1, "tests": [0], "depends_on": ["c"]},
                {"name": "b", "points": 1, "tests": [1], "depends_on": ["a"]},
                {"name": "c", "points": 1, "tests": [2], "depends_on": ["b"]},
            ],
            "a cycle of dependencies: a -> c -> b -> a",
        ),
        (
            [{"name": "a", "points": 1, "tests": [0]}, {"name": "a", "points": 1, "tests": [1]}],
            "names given twice: a",
        ),
        ([{"name": "a", "points": 1, "tests": [0], "scoring": "max"}], "'min' or 'sum'"),
    ],
)
def test_bad_groups_are_refused_naming_the_field(given: list[dict[str, Any]], words: str) -> None:
    with pytest.raises(ValidationError, match="groups") as caught:
        BatchItem.model_validate(judge_item(groups=given))
    assert words in str(caught.value)


def test_groups_belong_to_judge_items_only() -> None:
    with pytest.raises(ValidationError, match="judge item"):
        BatchItem.model_validate({"id": 1, "code": "1", "groups": []})


def test_an_item_with_groups_runs_every_test() -> None:
    plain = BatchItem.model_validate(judge_item())
    grouped = BatchItem.model_validate(
        judge_item(groups=[{"name": "a", "points": 1, "tests": "0-5"}])
    )
    assert judge_spec(plain)[0]["all_tests"] is False
    assert judge_spec(grouped)[0]["all_tests"] is True


def test_the_sweep_summary_adds_up_the_scores_of_items_with_groups() -> None:
    summary = SweepSummary()
    given = groups({"name": "a", "points": 30, "tests": [0, 1], "scoring": "sum"})
    for verdicts in (("AC", "AC"), ("AC", "WA")):
        record = BatchRecord(id=1, status="ok", judge=scored(judged(*verdicts), given))
        summary.add_score(record)
    summary.add_score(BatchRecord(id=2, status="ok", judge=judged("AC")))  # no groups
    summary.add_score(BatchRecord(id=3, status="error"))
    assert (summary.scored, summary.score, summary.max_score) == (2, 45, 60)
