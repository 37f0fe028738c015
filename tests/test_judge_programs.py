"""Problems judged by their own programs on a real local farm (Docker, Redis, Celery): testlib
checkers and Kattis output validators (many right answers, WA, presentation errors, the
checker's own failure, partial points), and interactive problems with interactors in C++ on
testlib and in Python (AC, WA, idleness, a submission that closes its pipe or never flushes,
one that attacks the interactor or signals the runner). Each program compiles once per worker."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm
from farm.models.batch import BatchRecord
from farm.models.judge import JudgeResult, Verdict
from tests.judge_programs import (
    GUESS,
    GUESS_CPP,
    GUESS_INTERACTOR,
    GUESS_PY_KATTIS,
    GUESS_PY_TESTLIB,
    GUESS_TESTS,
    LANGUAGE,
    QUERIES_CHECKER,
    SPLIT,
    SPLIT_BROKEN,
    SPLIT_CHECKER,
    SPLIT_TESTS,
    SPLIT_VALIDATOR,
    program,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TESTLIB_CHECKER = program("cpp17", SPLIT_CHECKER)
KATTIS_VALIDATOR = program("python3", SPLIT_VALIDATOR, "kattis")
INTERACTORS = {
    "cpp-testlib": program("cpp17", GUESS_INTERACTOR),
    "py-testlib": program("python3", GUESS_PY_TESTLIB),
    "py-kattis": program("python3", GUESS_PY_KATTIS, "kattis"),
}
# Short limits: an idle interaction ends at its wall time.
GUESS_LIMITS = {"time_s": 1.0, "wall_s": 3.0}
# submission -> the verdict each interactor gives it, per test
GUESS_VERDICTS = {
    "search": "AC",
    "wrong": "WA",
    "idle": "TLE",
    "close": "WA",
    "no-flush": "TLE",
    "attack": "WA",
    "kill-runner": "AC",
}


def checked(name: str, source: str, checker: dict[str, Any], **extra: Any) -> dict[str, Any]:
    item = {"id": name, "language": "python3", "source": source, "tests": SPLIT_TESTS}
    return {**item, "checker": "program", "checker_program": checker, "all_tests": True, **extra}


def guessed(name: str, source: str, interactor: str, **extra: Any) -> dict[str, Any]:
    language = LANGUAGE.get(name.partition("/")[2], "python3")
    item = {"id": name, "language": language, "source": source, "tests": GUESS_TESTS}
    return {**item, "interactor": INTERACTORS[interactor], "limits": GUESS_LIMITS, **extra}


def items() -> list[dict[str, Any]]:
    found = [checked(f"testlib/{name}", source, TESTLIB_CHECKER) for name, source in SPLIT.items()]
    found += [
        checked("kattis/first", SPLIT["first"], KATTIS_VALIDATOR),
        checked("kattis/half", SPLIT["half"], KATTIS_VALIDATOR),
        checked("kattis/wrong", SPLIT["wrong"], KATTIS_VALIDATOR),
        {**checked("testlib/broken", SPLIT["first"], TESTLIB_CHECKER), "tests": SPLIT_BROKEN},
        checked(
            "testlib/points-groups",
            SPLIT["off-by-one"],
            TESTLIB_CHECKER,
            groups=[
                {"name": "sum", "points": 60, "tests": "0-2", "scoring": "sum"},
                {"name": "min", "points": 40, "tests": "0-2"},
            ],
        ),
    ]
    for interactor in INTERACTORS:
        names = GUESS_VERDICTS if interactor != "py-kattis" else ("search", "wrong", "idle")
        found += [guessed(f"{interactor}/{name}", GUESS[name], interactor) for name in names]
    found += [
        {**guessed("cpp-testlib/search-cpp", GUESS_CPP, "cpp-testlib"), "language": "cpp17"},
        {  # with files: its box has a session process of the box's uid while it is judged
            **guessed("py-testlib/search-files", GUESS["search"], "py-testlib"),
            "tests": [{"stdin_file": "guess.in"}],
            "files": {"guess.in": "20 7\n"},
        },
        guessed(
            "py-testlib/linear-checked",
            GUESS["linear"],
            "py-testlib",
            checker="program",
            checker_program=program("python3", QUERIES_CHECKER),
            all_tests=True,
        ),
    ]
    return found


@pytest.fixture(scope="module")
def judge_farm(docker_env: Any) -> Iterator[Farm]:
    from farm.sandbox.catalog import build_image

    build_image("judge", client=docker_env)
    with Farm.local(images={"judge": 1}) as farm:
        yield farm


@pytest.fixture(scope="module")
def records(judge_farm: Farm) -> dict[str | int, BatchRecord]:
    return {r.id: r for r in judge_farm.map(items(), image="judge", ordered=False, retries=1)}


def judged(records: dict[str | int, BatchRecord], name: str) -> JudgeResult:
    record = records[name]
    assert record.ok, (name, record.kind, record.message)
    assert record.judge is not None
    return record.judge


@pytest.mark.parametrize("name", ["first", "last", "half"])
def test_a_testlib_checker_accepts_any_right_answer(
    records: dict[str | int, BatchRecord], name: str
) -> None:
    result = judged(records, f"testlib/{name}")
    assert [t.verdict for t in result.tests] == ["AC"] * 3, result.tests
    assert result.verdict == Verdict.AC and all(t.points == 1.0 for t in result.tests)
    assert result.tests[0].message.startswith("ok 5 = "), result.tests[0].message


def test_a_testlib_checker_says_wrong_answer_and_presentation_error(
    records: dict[str | int, BatchRecord],
) -> None:
    wrong = judged(records, "testlib/wrong")
    assert wrong.verdict == Verdict.WA and wrong.tests[0].message == "wrong answer 5 + 5 != 5"
    words = judged(records, "testlib/words")
    assert words.verdict == Verdict.WA, words  # farm has no PE: WA, saying so
    assert words.tests[0].message.startswith("presentation error: wrong output format"), words


def test_a_checkers_points_are_a_share_of_the_test_and_reach_the_groups(
    records: dict[str | int, BatchRecord],
) -> None:
    result = judged(records, "testlib/off-by-one")
    assert [(t.verdict, t.points) for t in result.tests] == [("WA", 0.5)] * 3, result.tests
    assert result.tests[0].message.startswith("points 0.5 1 + 5 is off by one")
    scored = judged(records, "testlib/points-groups")
    assert (scored.score, scored.max_score) == (50, 100), scored.groups  # 60 * 0.5 + 40 * 0.5


def test_a_checkers_own_failure_is_the_problems_not_farms(
    records: dict[str | int, BatchRecord],
) -> None:
    record = records["testlib/broken"]
    assert record.status == "error" and record.kind == "input" and record.attempts == 1, record
    assert "the checker failed: FAIL " in (record.message or ""), record.message


def test_a_kattis_validator_accepts_rejects_and_scores(
    records: dict[str | int, BatchRecord],
) -> None:
    first = judged(records, "kattis/first")
    assert [t.verdict for t in first.tests] == ["AC"] * 3 and first.tests[0].message == "5 = 1 + 4"
    half = judged(records, "kattis/half")  # n = 10 and 2 split evenly: score.txt says 0.25
    assert [(t.verdict, t.points) for t in half.tests] == [("AC", 1.0), ("AC", 0.25), ("AC", 0.25)]
    wrong = judged(records, "kattis/wrong")
    assert wrong.verdict == Verdict.WA and wrong.tests[0].message == "5 + 5 != 5"


@pytest.mark.parametrize("interactor", list(INTERACTORS))
@pytest.mark.parametrize("name", list(GUESS_VERDICTS))
def test_interactive_verdicts(
    records: dict[str | int, BatchRecord], interactor: str, name: str
) -> None:
    if interactor == "py-kattis" and name not in ("search", "wrong", "idle"):
        pytest.skip("the Kattis interactor plays the main cases")
    result = judged(records, f"{interactor}/{name}")
    if name == "kill-runner":  # its runner was never killed: no second attempt
        assert records[f"{interactor}/{name}"].attempts == 1
    want = GUESS_VERDICTS[name]
    assert result.verdict == want, result
    if want == "AC":
        assert [t.verdict for t in result.tests] == ["AC"] * 3, result.tests
        assert all(t.wall_s < 8.0 for t in result.tests), result.tests  # never a hang
        return
    first = result.tests[0]
    assert len(result.tests) == 1 and first.wall_s < 8.0, result.tests  # never a hang
    if want == "TLE":
        assert first.message.startswith("idleness limit exceeded"), first.message
    if name == "wrong":
        assert "guessed 3, the number was 7" in first.message, first.message
    if name == "close":
        assert "end of file" in first.message.lower(), first.message


def test_an_interactive_submission_s_memory_is_its_peak(
    records: dict[str | int, BatchRecord],
) -> None:
    """Read at its exit as a plain test's is (its item's starter starts it): a C++ or Python
    submission done within a few ms read 12-250 kB from one look before."""
    for name, low_kb in (("cpp-testlib/search-cpp", 1024), ("py-testlib/search", 4096)):
        peaks = [test.memory_kb for test in judged(records, name).tests]
        assert min(peaks) > low_kb and max(peaks) - min(peaks) < 1024, (name, peaks)


@pytest.mark.parametrize("interactor", ["cpp-testlib", "py-testlib"])
def test_a_submission_cannot_reach_the_interactor(
    records: dict[str | int, BatchRecord], interactor: str
) -> None:
    """It may not read the interactor's fds (its input holds the secret), write its memory,
    read its environment, or signal it: each is refused, and it guesses blind."""
    result = judged(records, f"{interactor}/attack")
    first = result.tests[0]
    assert result.verdict == Verdict.WA and "guessed 0, the number was 7" in first.message
    tried = ast.literal_eval(first.stderr.strip().splitlines()[0])
    assert {what for what, _ in tried} >= {"fd", "mem", "environ", "kill", "stop"}, tried
    assert all(errno != 0 for _, errno in tried), tried
    fds = ast.literal_eval(first.stderr.strip().splitlines()[1])
    assert fds == [0, 1, 2, 3], fds  # stdio, and the fd of its own listing


def test_a_cpp_submission_and_a_checker_after_the_interactor(
    records: dict[str | int, BatchRecord],
) -> None:
    result = judged(records, "cpp-testlib/search-cpp")
    assert [t.verdict for t in result.tests] == ["AC"] * 3, result.tests
    files = judged(records, "py-testlib/search-files")
    assert [t.verdict for t in files.tests] == ["AC"], files.tests
    linear = judged(records, "py-testlib/linear-checked")  # 7, 20 and 1 queries
    assert [(t.verdict, t.points) for t in linear.tests] == [
        ("AC", 1.0),
        ("WA", 0.5),
        ("AC", 1.0),
    ], linear.tests
    assert linear.tests[1].message == "points 0.5 20 queries is too many"


def test_a_problems_programs_compile_once_per_worker(
    judge_farm: Farm, records: dict[str | int, BatchRecord]
) -> None:
    """One item of a problem compiles its checker (or interactor); the others of the map wait
    for that build, and a later judging finds it in the worker's cache."""
    for name, prefix in (("checker", "testlib/"), ("interactor", "cpp-testlib/")):
        compiles = [
            record.judge.program_compiles[name]
            for key, record in records.items()
            if str(key).startswith(prefix) and record.judge and record.judge.program_compiles
        ]
        assert len(compiles) >= 5 and sum(not c.cached for c in compiles) == 1, compiles
    again = judge_farm.judge(
        "python3",
        SPLIT["last"] + "# another submission\n",
        SPLIT_TESTS,
        checker="program",
        checker_program=TESTLIB_CHECKER,
    )
    assert again.verdict == Verdict.AC, again
    assert again.program_compiles is not None and again.program_compiles["checker"].cached
    assert again.program_artifacts is None  # the worker's, not the caller's


PACKAGES = Path(__file__).parent / "problems"
KATTIS_GUESS = (
    "lo, hi = 1, 100\nwhile True:\n    mid = (lo + hi) // 2\n    print(mid, flush=True)\n"
    "    said = input().strip()\n    if said == 'correct':\n        break\n"
    "    if said == 'lower':\n        hi = mid - 1\n    else:\n        lo = mid + 1\n"
)
POLYGON_SUM = "input()\nprint(sum(map(int, input().split())))\n"


def test_packages_are_judged_by_their_own_checker_and_interactor(judge_farm: Farm) -> None:
    """A Kattis interactive package (its Python interactor) and a Polygon package (its
    testlib check.cpp), read by ``farm.judge.packages``, judged end to end."""
    guess = judge_farm.judge("python3", KATTIS_GUESS, problem=PACKAGES / "kattis_guess")
    assert guess.verdict == Verdict.AC and len(guess.tests) == 3, guess
    blind = judge_farm.judge(
        "python3", "print(0, flush=True)\ninput()\n", problem=PACKAGES / "kattis_guess"
    )
    assert blind.verdict == Verdict.WA, blind
    total = judge_farm.judge("python3", POLYGON_SUM, problem=PACKAGES / "polygon_sum")
    assert total.verdict == Verdict.AC and total.tests[0].message.startswith("ok the sum is"), total
    extra = judge_farm.judge(
        "python3", POLYGON_SUM + "print(0)\n", problem=PACKAGES / "polygon_sum"
    )
    assert extra.verdict == Verdict.WA, extra
    assert (
        extra.tests[0].message
        == "presentation error: wrong output format extra output after the sum"
    )
