"""The judge's shapes: a test case, limits and groups of tests with points as users give them,
and the verdicts a judge step brings back (``JudgeResult``, also what a judge item's
``BatchRecord.judge`` holds, with its score when the item has groups); the step itself is the
kernel's ``protocol.JudgeSpec``, checked by ``frames.JudgeStep``. Verdicts are the kernel's
(``protocol.Verdict``); ``IE`` is farm's own failure, retried like ``infra``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from farm.kernel.judge import checkers
from farm.models.model_base import Model


class Verdict(StrEnum):
    """Judge0's and ICPC's verdicts; the values are ``farm.kernel.wire.protocol.VERDICTS``."""

    AC = "AC"  # accepted
    WA = "WA"  # wrong answer
    TLE = "TLE"  # over the CPU time (or the wall time: 3x, at least + 5 s)
    MLE = "MLE"  # over the peak resident memory
    RE = "RE"  # a non-zero exit or a signal
    OLE = "OLE"  # over the output limit
    CE = "CE"  # did not compile
    IE = "IE"  # farm failed (retried like infra)
    PENDING = "PENDING"  # ran, waiting for a special judge (never in a user's hands)


class TestCase(Model):
    """One test: ``stdin`` or ``stdin_file`` (a path among the item's ``files``), and
    ``expected`` or ``expected_file`` (none needed with a special judge)."""

    __test__ = False  # not a pytest class

    stdin: str | None = None
    stdin_file: str | None = None
    expected: str | None = None
    expected_file: str | None = None

    @model_validator(mode="after")
    def _one_each(self) -> TestCase:
        if self.stdin is not None and self.stdin_file is not None:
            raise ValueError("give 'stdin' or 'stdin_file', not both")
        if self.expected is not None and self.expected_file is not None:
            raise ValueError("give 'expected' or 'expected_file', not both")
        return self


class JudgeLimits(Model):
    """Per test: CPU seconds, wall seconds (default 3x the CPU, and at least 5 s more: a
    loaded worker's tests wait for a core), peak memory, stdout size; and the compile's own
    CPU seconds."""

    time_s: float = Field(default=2.0, gt=0, le=60)
    wall_s: float | None = Field(default=None, gt=0, le=600)
    memory_mb: int = Field(default=256, ge=16, le=8192)
    output_mb: int = Field(default=16, ge=1, le=256)
    compile_time_s: float = Field(default=30.0, gt=0, le=600)


class TestGroup(Model):
    """A subtask: ``points`` for ``tests`` (indices into the item's tests, from 0, or ``"A-B"``
    inclusive ranges), scored ``min`` (all or nothing, as IOI) or ``sum`` (its points' share of
    its tests passed), and worth nothing unless each group it ``depends_on`` passed whole (as
    CMS and Polygon). Scoring: ``farm.judge.scoring``."""

    __test__ = False

    name: str = Field(min_length=1)
    points: float = Field(ge=0)
    tests: list[int] = Field(min_length=1)
    scoring: Literal["min", "sum"] = "min"
    depends_on: list[str] = Field(default_factory=list)

    @field_validator("tests", mode="before")
    @classmethod
    def _ranges(cls, given: Any) -> Any:
        """``"0-2"``, ``[0, "3-5", 7]`` or ``"0-2,7"`` as the list of indices they name."""
        parts = given.split(",") if isinstance(given, str) else given
        if not isinstance(parts, list):
            return given
        tests: list[Any] = []
        for part in parts:
            if isinstance(part, str) and "-" in part.strip()[1:]:
                first, _, last = part.strip().partition("-")
                if not (first.strip().isdigit() and last.strip().isdigit()):
                    raise ValueError(f"{part!r} is not a range of test indices like '0-4'")
                if int(first) > int(last):
                    raise ValueError(f"the range {part!r} is empty")
                tests.extend(range(int(first), int(last) + 1))
            else:
                tests.append(part)
        return tests


class JudgeProgram(Model):
    """A problem's own program, compiled once per problem: a checker (an item's
    ``checker_program``) or an ``interactor``, in a language of the judge image, speaking
    ``protocol``: testlib's (``checker input output answer``, the interactor's stdin and
    stdout wired to the submission's; exit 0 AC, 1 WA, 2 PE, 3 fail, 7 points) or the Kattis
    problem format's (``validator input answer feedback_dir``; exit 42 AC, 43 WA)."""

    language: str = Field(min_length=1)
    source: str = Field(min_length=1)
    protocol: Literal["testlib", "kattis"] = "testlib"


class TestResult(Model):
    """One test's run: its verdict, CPU and wall time, peak RSS, output size, how it ended."""

    __test__ = False

    index: int = 0
    verdict: Verdict = Verdict.IE
    message: str = ""
    time_s: float = 0.0
    wall_s: float = 0.0
    memory_kb: int = 0
    output_bytes: int = 0
    exit_code: int | None = None
    signal: int | None = None
    stderr: str = ""
    output: str | None = Field(default=None, description="base64, for a special judge only")
    points: float | None = Field(
        default=None, description="the share of the test a checker program gave it (0 to 1)"
    )


class CompileResult(Model):
    status: Literal["ok", "error"]
    output: str
    time_s: float
    wall_s: float
    cached: bool


class GroupScore(Model):
    """A group's outcome: what it ``scored`` of its ``points``; its ``verdict``, its first
    failing test's (its index: ``test``) or ``AC``; ``blocked_by``, a group it depends on that
    did not pass whole (it then scores 0)."""

    name: str
    points: float
    scored: float
    verdict: Verdict
    test: int | None = None
    blocked_by: str | None = None


class JudgeResult(Model):
    """A submission's verdict (its first failing test's, ``CE``, ``IE`` or ``AC``), each test
    run's measurements, the compile, and the language's version as the image names it; with
    groups, its ``score`` of ``max_score`` and each group's (else ``None``)."""

    verdict: Verdict
    message: str = ""
    kind: str | None = Field(default=None, description="with IE: input when refused")
    tests: list[TestResult] = Field(default_factory=list)
    compile: CompileResult | None = None
    language: str = ""
    version: str = ""
    artifact: dict[str, str] | None = Field(default=None, description="the worker's, not yours")
    program_compiles: dict[str, CompileResult] | None = Field(
        default=None, description="the compiles of the checker and interactor (cached or not)"
    )
    program_artifacts: dict[str, dict[str, str]] | None = Field(
        default=None, description="the worker's, not yours: the checker's, interactor's builds"
    )
    score: float | None = Field(default=None, description="the groups' points scored")
    max_score: float | None = Field(default=None, description="the groups' points")
    groups: list[GroupScore] | None = None

    @property
    def accepted(self) -> bool:
        return self.verdict == Verdict.AC

    @property
    def passed(self) -> int:
        """How many tests were accepted (for partial scores)."""
        return sum(test.verdict == Verdict.AC for test in self.tests)


MAX_WORDS = 64  # of a judge item's compile_options, and of its args
MAX_WORDS_CHARS = 4096  # all of them together


def check_words(name: str, words: list[str] | None) -> None:
    """``words`` can be argv words (execve's: no NUL) within the bounds; no shell ever reads
    them, so a ``;`` or ``$(...)`` is only text."""
    if words is None:
        return
    if len(words) > MAX_WORDS or sum(len(word) for word in words) > MAX_WORDS_CHARS:
        raise ValueError(f"{name}: at most {MAX_WORDS} words of {MAX_WORDS_CHARS} characters")
    if any("\0" in word for word in words):
        raise ValueError(f"{name}: a word holds a NUL character")


def check_judge_item(
    checker: str,
    special_judge: str | None,
    tests: list[TestCase] | None,
    files: dict[str, str] | None,
    checker_program: JudgeProgram | None = None,
    interactor: JudgeProgram | None = None,
    groups: Sequence[TestGroup] | None = None,
) -> None:
    """A judge item's (or a problem's) parts agree: a known checker (a special judge with its
    code, a checker program with its program), tests whose ``*_file`` names are among its
    ``files``, expected outputs unless a special judge, a checker program or an interactor
    decides, and ``groups`` that agree with the tests (``check_groups``)."""
    if (checker == "program") != (checker_program is not None):
        raise ValueError(
            "checker 'program' needs 'checker_program', and 'checker_program' needs checker "
            "'program'"
        )
    if interactor is not None and checker not in ("program", "tokens", "none"):
        raise ValueError("an interactive item's verdict is its interactor's (or checker_program)")
    if checker == "special":
        if not special_judge:
            raise ValueError("checker 'special' needs 'special_judge' (Python defining check)")
        if interactor is not None:
            raise ValueError("a special judge cannot judge an interactive item")
    elif checker != "program":
        try:
            checkers.parse(checker)
        except checkers.CheckerError as exc:
            raise ValueError(str(exc)) from None
    if not tests:
        raise ValueError("a judge item needs at least one test")
    for number, test in enumerate(tests):
        for name in (test.stdin_file, test.expected_file):
            if name is not None and name not in (files or {}):
                raise ValueError(f"test {number}: {name!r} is not among the item's files")
        if (
            checker not in ("special", "none", "program")
            and interactor is None
            and test.expected is None
            and test.expected_file is None
        ):
            raise ValueError(f"test {number} has no 'expected' or 'expected_file'")
    if groups is not None:
        check_groups(groups, len(tests))


def group_order(groups: Sequence[TestGroup]) -> list[TestGroup]:
    """``groups`` with each after those it depends on; a cycle or an unknown name refused."""
    by_name = {group.name: group for group in groups}
    done: dict[str, bool] = {}  # name -> finished (False: on the path being walked)
    order: list[TestGroup] = []

    def visit(group: TestGroup, path: list[str]) -> None:
        if done.get(group.name) is False:
            cycle = path[path.index(group.name) :] + [group.name]
            raise ValueError(f"groups: a cycle of dependencies: {' -> '.join(cycle)}")
        if group.name in done:
            return
        done[group.name] = False
        for name in group.depends_on:
            if name not in by_name:
                raise ValueError(f"groups[{group.name!r}].depends_on: no group named {name!r}")
            visit(by_name[name], [*path, group.name])
        done[group.name] = True
        order.append(group)

    for group in groups:
        visit(group, [])
    return order


def check_groups(groups: Sequence[TestGroup], count: int) -> None:
    """An item's groups agree with its ``count`` tests: names unique, indices in range,
    dependencies named and without a cycle."""
    names = [group.name for group in groups]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"groups: names given twice: {', '.join(twice)}")
    for group in groups:
        wrong = sorted({index for index in group.tests if not 0 <= index < count})
        if wrong:
            raise ValueError(
                f"groups[{group.name!r}].tests: {wrong} out of range (the item has {count} "
                f"tests, indices 0 to {count - 1})"
            )
    group_order(groups)
