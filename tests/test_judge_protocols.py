"""How a problem's checker or interactor is read, without a sandbox: testlib's and the Kattis
format's exit codes, partial points, and the verdict of an interactive test from both sides'
ends (Kattis' and DOMjudge's rule; which side ended first, with real processes), and what a
judge item with programs accepts."""

from __future__ import annotations

import os
import select
import subprocess
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from farm.judge.scoring import scored
from farm.kernel.boxes import interaction
from farm.kernel.boxes.judge_runner import _verdict
from farm.kernel.boxes.testrun import Limits, Measured
from farm.kernel.boxes.trees import exiting
from farm.kernel.judge import protocols
from farm.kernel.judge.protocols import Said
from farm.models.batch import BatchItem
from farm.models.judge import JudgeResult, TestGroup, TestResult, Verdict


@pytest.mark.parametrize(
    ("code", "signal", "stderr", "verdict", "points", "message"),
    [
        (0, None, "ok 3 numbers\n", "AC", 1.0, "ok 3 numbers"),
        (1, None, "wrong answer 4 != 5", "WA", 0.0, "wrong answer 4 != 5"),
        (2, None, "wrong output format x", "WA", 0.0, "presentation error: wrong output format x"),
        (3, None, "FAIL bad answer file", "IE", 0.0, "the checker failed: FAIL bad answer file"),
        (7, None, "points 0.25 close", "WA", 0.25, "points 0.25 close"),
        (7, None, "points 1 all", "AC", 1.0, "points 1 all"),
        (7, None, "points 30 many", "AC", 1.0, "points 30 many"),  # more: the whole test
        (7, None, "points_info=x", "IE", 0.0, "the checker gave points that are not a number"),
        (5, None, "", "IE", 0.0, "the checker exited with code 5, not a testlib verdict"),
        (None, 11, "", "IE", 0.0, "the checker died of signal 11"),
    ],
)
def test_testlib_exit_codes(
    code: int | None, signal: int | None, stderr: str, verdict: str, points: float, message: str
) -> None:
    said = protocols.testlib(code, signal, stderr)
    assert (said.verdict, said.points) == (verdict, points)
    assert said.message.startswith(message), said.message


@pytest.mark.parametrize(
    ("code", "score", "verdict", "points"),
    [
        (42, None, "AC", 1.0),
        (42, "0.5\n", "AC", 0.5),
        (42, "many", "IE", 0.0),
        (43, "0.5", "WA", 0.0),
        (0, None, "IE", 0.0),
        (1, None, "IE", 0.0),
    ],
)
def test_kattis_exit_codes(code: int, score: str | None, verdict: str, points: float) -> None:
    said = protocols.kattis(code, None, "feedback", score)
    assert (said.verdict, said.points) == (verdict, points)


LIMITS = Limits(cpu_s=1.0, wall_s=3.0, memory_kb=256 << 10, output_bytes=1 << 20, stack_bytes=0)


def run(
    code: int | None = 0, signal: int | None = None, cpu: float = 0.1, killed: str | None = None
) -> Measured:
    return Measured(code, signal, cpu, 0.5, 10_000, killed, b"", b"", 0)


@pytest.mark.parametrize(
    ("sub", "said", "first", "verdict"),
    [
        (run(), Said("AC", 1.0, "ok"), False, "AC"),
        (run(), Said("WA", 0.0, "no"), False, "WA"),
        (run(signal=13), Said("WA", 0.0, "no"), True, "WA"),  # SIGPIPE after the WA
        (run(signal=13), Said("AC", 1.0, "ok"), True, "RE"),
        (run(cpu=2.0, killed="cpu"), Said("WA", 0.0, "eof"), False, "TLE"),
        (run(cpu=2.0, killed="cpu"), Said("WA", 0.0, "no"), True, "WA"),
        (run(killed="wall"), Said("AC", 0.0, ""), False, "TLE"),  # idleness
        (run(killed="memory"), Said("AC", 1.0, "ok"), False, "MLE"),
        (run(code=3), Said("AC", 1.0, "ok"), False, "RE"),
        (run(), Said("IE", 0.0, "the interactor failed"), False, "IE"),
        (run(killed="cpu", cpu=2.0), Said("IE", 0.0, "FAIL"), False, "IE"),
    ],
)
def test_interactive_verdicts_follow_kattis_and_domjudge(
    sub: Measured, said: Said, first: bool, verdict: str
) -> None:
    done = interaction.Interaction(sub, said, first, b"")
    got, message, _ = interaction.verdict(done, LIMITS, _verdict)
    assert got == verdict, message
    if sub.killed == "wall":
        assert message.startswith("idleness limit exceeded")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def ended(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process`` and wait (on its pidfd) until it is a zombie, not reaped."""
    pidfd = os.pidfd_open(process.pid)
    process.kill()
    select.select([pidfd], [], [])
    os.close(pidfd)


def side(
    process: subprocess.Popen[bytes], ended_at: float, killed: str | None = None
) -> interaction.Side:
    return interaction.Side(process.pid, LIMITS, -1, ended_at=ended_at, killed=killed)


def test_a_process_is_exiting_from_its_kill_to_its_reaping(
    sleeper: subprocess.Popen[bytes],
) -> None:
    assert not exiting(sleeper.pid)
    ended(sleeper)
    assert exiting(sleeper.pid)  # a zombie: its pipes are closed, its pidfd may lag
    sleeper.wait()
    assert exiting(sleeper.pid)  # gone


@pytest.mark.parametrize("how", ["exiting", "memory", "cpu"])
def test_an_interactor_answering_the_submissions_end_did_not_end_first(
    sleeper: subprocess.Popen[bytes], how: str
) -> None:
    """The submission stopped by the runner for its limits, or exiting, when the interactor's
    end is seen first (it read end of file and said WA): the submission's end decides."""
    if how == "exiting":
        ended(sleeper)
    sub = side(sleeper, ended_at=2.0, killed=None if how == "exiting" else how)
    interaction.interactor_ended(sub, decided=lambda: True)
    assert sub.ending and sub.killed == (None if how == "exiting" else how)
    assert not interaction.ended_first(side(sleeper, ended_at=1.0), sub)


def test_an_interactor_that_says_wa_first_decides(sleeper: subprocess.Popen[bytes]) -> None:
    sub = side(sleeper, ended_at=2.0)
    interaction.interactor_ended(sub, decided=lambda: True)
    assert not sub.ending and sub.killed == "decided"
    assert sleeper.wait(timeout=10) == -9  # killed: no need to wait for it
    assert interaction.ended_first(side(sleeper, ended_at=1.0), sub)


def test_partial_points_score_as_shares_of_tests() -> None:
    tests = [
        TestResult(index=0, verdict=Verdict.AC),
        TestResult(index=1, verdict=Verdict.WA, points=0.5),
        TestResult(index=2, verdict=Verdict.AC, points=0.25),
    ]
    result = JudgeResult(verdict=Verdict.WA, tests=tests)
    groups = [
        TestGroup(name="sum", points=30, tests=[0, 1, 2], scoring="sum"),
        TestGroup(name="min", points=40, tests=[0, 1, 2]),
    ]
    done = scored(result, groups)
    assert done.groups is not None
    assert [g.scored for g in done.groups] == [17.5, 10.0]  # 30 * 1.75 / 3, 40 * 0.25


def test_a_judge_item_with_programs() -> None:
    base = {"id": 1, "language": "python3", "source": "print(1)", "tests": [{"stdin": "1"}]}
    checker = {"language": "cpp17", "source": "int main(){}"}
    BatchItem.model_validate({**base, "checker": "program", "checker_program": checker})
    BatchItem.model_validate({**base, "interactor": {**checker, "protocol": "kattis"}})
    with pytest.raises(ValidationError, match="needs 'checker_program'"):
        BatchItem.model_validate({**base, "checker": "program"})
    with pytest.raises(ValidationError, match="needs 'checker_program'"):
        BatchItem.model_validate({**base, "checker_program": checker})
    with pytest.raises(ValidationError, match="protocol"):
        BatchItem.model_validate({**base, "interactor": {**checker, "protocol": "icpc"}})
