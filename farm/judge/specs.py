"""What a judge item becomes on its way to a worker: the kernel's judge step (``JudgeSpec``),
the files its box gets and the item's timeout, all decided by the client so that a chunk
holds everything its worker needs. Expected outputs travel inline and never as files of the
box (a submission could print them; the runner, root in the box, reads no file the box could
have replaced); large inputs stay files of the box, opened as the box. An item with groups
runs every test (``all_tests``): each group's score needs each of its tests' verdicts.
"""

from __future__ import annotations

import base64

from farm.kernel.boxes.checking import COMPILE_S
from farm.kernel.wire.protocol import JudgeSpec, JudgeTest
from farm.models.batch import BatchItem
from farm.models.judge import JudgeLimits

INPUTS_DIR = ".judge-in"
SLACK_S = 30.0


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def judge_spec(item: BatchItem) -> tuple[JudgeSpec, dict[str, str], float]:
    """The judge step, the box's files and the timeout of the whole item (compile, every
    test's wall limit, slack)."""
    assert item.language is not None and item.source is not None and item.tests is not None
    limits = item.judge_limits or JudgeLimits()
    files = dict(item.files or {})
    tests: list[JudgeTest] = []
    for test in item.tests:
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
        "language": item.language,
        "source": item.source,
        "tests": tests,
        "checker": item.checker,
        "time_s": limits.time_s,
        "memory_mb": limits.memory_mb,
        "output_mb": limits.output_mb,
        "all_tests": item.all_tests or bool(item.groups),  # a group's score needs each test
        "keep_outputs": item.keep_outputs,
        "compile_time_s": limits.compile_time_s,
    }
    if limits.wall_s is not None:
        spec["wall_s"] = limits.wall_s
    # The problem's own programs: compiled once per problem on a worker (its cache), run as
    # the box's judge uid, out of the submission's reach (docs/design/judge.md).
    if item.checker_program is not None:
        spec["checker_program"] = item.checker_program.model_dump()  # type: ignore[typeddict-item]
    if item.interactor is not None:
        spec["interactor"] = item.interactor.model_dump()  # type: ignore[typeddict-item]
    # The expected outputs never reach the box: a submission could print them.
    inputs = {test.stdin_file for test in item.tests}
    hidden = {test.expected_file for test in item.tests} - inputs
    files = {path: text for path, text in files.items() if path not in hidden}
    per_test = (limits.wall_s or limits.time_s * 3 + 5.0) + 0.5  # its wall limit, start, check
    timeout = limits.compile_time_s * 2 + 5.0 + per_test * len(tests) + SLACK_S
    programs = [p for p in (item.checker_program, item.interactor) if p is not None]
    if programs:  # their compiles (checking.COMPILE_S at least), a checker's run after each test
        compile_s = max(limits.compile_time_s, COMPILE_S)
        timeout += len(programs) * (compile_s * 2 + 5.0) + per_test * len(tests)
    return spec, files, item.timeout_s or timeout
