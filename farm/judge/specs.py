"""What a judge item becomes in its worker: the kernel's judge step (``JudgeSpec``), the files
its box gets and the item's timeout, built from its problem (inline, or stored and named by
digest: ``farm.judge.problems``) and its submission, by one function for both. The client
sends a ``Submission``; the worker resolves its problem and calls ``build_step``.

Expected outputs travel inline in the step and never as files of the box (a submission could
print them; the runner, root in the box, reads no file the box could have replaced); large
inputs stay files of the box, opened as the box. An item with groups runs every test
(``all_tests``): each group's score needs each of its tests' verdicts.
"""

from __future__ import annotations

import base64

from farm.judge.problems import Problem
from farm.kernel.boxes.checking import COMPILE_S
from farm.kernel.wire.protocol import JudgeSpec, JudgeTest
from farm.models.batch import BatchItem, Submission
from farm.models.judge import JudgeLimits

INPUTS_DIR = ".judge-in"
BUILD_DIR = ".judge"  # the runner's working directory (farm.kernel.boxes.judge_runner.BUILD_DIR)
SLACK_S = 30.0


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def problem_of(item: BatchItem) -> Problem:
    """An inline judge item's problem (its fields were checked when the item was read)."""
    return Problem.model_construct(
        tests=item.tests or [],
        checker=item.checker,
        checker_program=item.checker_program,
        interactor=item.interactor,
        special_judge=item.special_judge,
        files=item.files,
        groups=item.groups,
        limits=item.judge_limits,
    )


def submission_of(item: BatchItem, problem: str | Problem) -> Submission:
    """What a worker gets of judge item ``item`` whose problem is ``problem``."""
    assert item.language is not None and item.source is not None
    limits = item.judge_limits
    return Submission(
        language=item.language,
        source=item.source,
        problem=problem,
        limits=None if limits is None else limits.model_dump(include=limits.model_fields_set),
        all_tests=item.all_tests,
        keep_outputs=item.keep_outputs,
        timeout_s=item.timeout_s,
        compile_options=item.compile_options,
        args=item.args,
    )


def limits_of(problem: Problem, submission: Submission) -> JudgeLimits:
    """The problem's limits with the item's own over them."""
    if not submission.limits:
        return problem.limits or JudgeLimits()
    base = (problem.limits or JudgeLimits()).model_dump()
    return JudgeLimits.model_validate({**base, **submission.limits})


def timeout_of(problem: Problem, submission: Submission) -> float:
    """The whole item's timeout: the compile's, each test's wall limit, slack."""
    if submission.timeout_s is not None:
        return submission.timeout_s
    limits = limits_of(problem, submission)
    wall_s = limits.wall_s or max(limits.time_s * 3, limits.time_s + 5.0)  # the kernel's default
    per_test = wall_s + 0.5  # its wall limit, start, check
    timeout = limits.compile_time_s * 2 + 5.0 + per_test * len(problem.tests) + SLACK_S
    programs = [p for p in (problem.checker_program, problem.interactor) if p is not None]
    if programs:  # their compiles (checking.COMPILE_S at least), a checker's run after each test
        compile_s = max(limits.compile_time_s, COMPILE_S)
        timeout += len(programs) * (compile_s * 2 + 5.0) + per_test * len(problem.tests)
    return timeout


def build_step(problem: Problem, submission: Submission) -> tuple[JudgeSpec, dict[str, str], float]:
    """The judge step, the box's files and the timeout of the whole item."""
    limits = limits_of(problem, submission)
    files = dict(problem.files or {})
    tests: list[JudgeTest] = []
    for test in problem.tests:
        given: JudgeTest = {}
        if test.stdin is not None:
            given["stdin"] = _b64(test.stdin)
        if test.stdin_file is not None:
            given["stdin_path"] = test.stdin_file
        expected = files[test.expected_file] if test.expected_file is not None else test.expected
        if expected is not None:
            given["expected"] = _b64(expected)
        tests.append(given)
    spec: JudgeSpec = {
        "language": submission.language,
        "source": submission.source,
        "tests": tests,
        "checker": problem.checker,
        "time_s": limits.time_s,
        "memory_mb": limits.memory_mb,
        "output_mb": limits.output_mb,
        # a group's score needs each test's verdict
        "all_tests": submission.all_tests or bool(problem.groups),
        "keep_outputs": submission.keep_outputs,
        "compile_time_s": limits.compile_time_s,
    }
    if limits.wall_s is not None:
        spec["wall_s"] = limits.wall_s
    if submission.compile_options:
        spec["compile_options"] = list(submission.compile_options)
    if submission.args:
        spec["run_args"] = list(submission.args)
    # The problem's own programs: compiled once per problem on a worker (its cache), run as
    # the box's judge uid, out of the submission's reach (docs/design/judge.md).
    if problem.checker_program is not None:
        spec["checker_program"] = problem.checker_program.model_dump()  # type: ignore[typeddict-item]
    if problem.interactor is not None:
        spec["interactor"] = problem.interactor.model_dump()  # type: ignore[typeddict-item]
    # The expected outputs never reach the box: a submission could print them.
    inputs = {test.stdin_file for test in problem.tests}
    hidden = {test.expected_file for test in problem.tests} - inputs
    files = {path: text for path, text in files.items() if path not in hidden}
    return spec, files, timeout_of(problem, submission)


def judge_spec(item: BatchItem) -> tuple[JudgeSpec, dict[str, str], float]:
    """``build_step`` of an inline judge item, as its worker would build it."""
    problem = problem_of(item)
    return build_step(problem, submission_of(item, problem))
