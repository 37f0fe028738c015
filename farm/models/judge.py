"""The judge's shapes: a test case and limits as users give them, and the verdicts a judge
step brings back (``JudgeResult``, also what a judge item's ``BatchRecord.judge`` holds); the
step itself is the kernel's ``protocol.JudgeSpec``, checked by ``frames.JudgeStep``. Verdicts
are the kernel's (``protocol.Verdict``); ``IE`` is farm's own failure, retried like ``infra``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from farm.kernel.judge import checkers
from farm.models.base import Model


class Verdict(StrEnum):
    """Judge0's and ICPC's verdicts; the values are ``farm.kernel.wire.protocol.VERDICTS``."""

    AC = "AC"  # accepted
    WA = "WA"  # wrong answer
    TLE = "TLE"  # over the CPU time (or 3x + 1 s of wall time)
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
    """Per test: CPU seconds, wall seconds (default 3x the CPU + 5 s: a loaded worker's tests
    wait for a core), peak memory, stdout size; and the compile's own CPU seconds."""

    time_s: float = Field(default=2.0, gt=0, le=60)
    wall_s: float | None = Field(default=None, gt=0, le=600)
    memory_mb: int = Field(default=256, ge=16, le=8192)
    output_mb: int = Field(default=16, ge=1, le=256)
    compile_time_s: float = Field(default=30.0, gt=0, le=600)


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


class CompileResult(Model):
    status: Literal["ok", "error"]
    output: str
    time_s: float
    wall_s: float
    cached: bool


class JudgeResult(Model):
    """A submission's verdict (its first failing test's, ``CE``, ``IE`` or ``AC``), each test
    run's measurements, the compile, and the language's version as the image names it."""

    verdict: Verdict
    message: str = ""
    kind: str | None = Field(default=None, description="with IE: input when refused")
    tests: list[TestResult] = Field(default_factory=list)
    compile: CompileResult | None = None
    language: str = ""
    version: str = ""
    artifact: dict[str, str] | None = Field(default=None, description="the worker's, not yours")

    @property
    def accepted(self) -> bool:
        return self.verdict == Verdict.AC

    @property
    def passed(self) -> int:
        """How many tests were accepted (for partial scores)."""
        return sum(test.verdict == Verdict.AC for test in self.tests)


def check_judge_item(
    checker: str,
    special_judge: str | None,
    tests: list[TestCase] | None,
    files: dict[str, str] | None,
) -> None:
    """A judge item's parts agree: a known checker (a special judge with its code), tests
    whose ``*_file`` names are among its ``files``, expected outputs unless a special judge."""
    if checker == "special":
        if not special_judge:
            raise ValueError("checker 'special' needs 'special_judge' (Python defining check)")
    else:
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
            checker not in ("special", "none")
            and test.expected is None
            and test.expected_file is None
        ):
            raise ValueError(f"test {number} has no 'expected' or 'expected_file'")
