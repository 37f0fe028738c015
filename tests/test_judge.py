"""The judge, end to end: a problem set judged in every language of the judge image through one
``Farm.map`` on a real local farm (Docker, Redis, Celery), every verdict checked per test;
checkers, files, the special judge, the compile cache, border cases as other judges take them
(Java's class names, Go's package, compiles that flood or hang), and submissions that attack
their box without changing any other item's verdict."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from farm.client import Farm
from farm.judge.languages import DEFAULT_LANGUAGES, OPT_IN
from farm.judge.languages import LANGUAGES as JUDGE_LANGUAGES
from farm.local.embedded import LocalFarm
from farm.models.batch import BatchRecord
from farm.models.judge import Verdict
from tests.judge_problems import (
    BIG_CPP,
    BIG_PY,
    BORDER_CASES,
    BORDER_LIMITS,
    FLOAT_FAR,
    FLOAT_NEAR,
    FLOAT_TESTS,
    LANGUAGES,
    SLOW_START,
    SORT_CPP,
    SORT_PY,
    SPECIAL_JUDGE,
    SPECIAL_OTHER,
    SPECIAL_TESTS,
    SPECIAL_WRONG,
    SUM,
    SUM_LIMITS,
    SUM_TESTS,
    SUM_VERDICTS,
    big_input,
    sort_tests,
    sum_items,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# How each RE submission ends: an exit code, or a signal (SIGABRT, SIGSEGV).
RE_ENDS = {"cpp17": ("signal", 6), "cpp20": ("signal", 11)}  # the others: exit code 3
FLAG = "/tmp/farm-judge-flag"

ATTACKS = {
    # A fork bomb: its box's pids limit holds it, its end kills it all.
    "fork-bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    ),
    # A child left running by each test: the next test of the item must not find it.
    "left-child": (
        "import os, subprocess\n"
        "def comm(pid):\n    try:\n        return open(f'/proc/{pid}/comm').read().strip()\n"
        "    except OSError:\n        return ''\n"
        "left = [p for p in os.listdir('/proc') if p.isdigit() and comm(p) == 'sleep']\n"
        "subprocess.Popen(['sleep', '1000'])\n"
        "a, b = map(int, input().split())\nprint('leftover' if left else a + b)\n"
    ),
    # Writes outside its workspace (its box's /tmp, the read-only root), then answers.
    "writes-outside": (
        f"import os\nopen({FLAG!r}, 'w').write('x')\nopen('/workspace/flag', 'w').write('x')\n"
        "try:\n    open('/etc/farm-flag', 'w')\nexcept OSError:\n    pass\n"
        "a, b = map(int, input().split())\nprint(a + b)\n"
    ),
}
# Signals the runner (its parent) from its first instant on, then answers: the runner's real
# uid must never be the test's while it starts (as a posix_spawn's would be: the test could end
# its item as IE).
KILL_RUNNER = (
    "#include <csignal>\n#include <cstdio>\n#include <unistd.h>\n"
    "int main(){for(int i=0;i<100000;i++)kill(getppid(),SIGKILL);kill(-1,SIGKILL);"
    'long long a,b;if(scanf("%lld %lld",&a,&b)!=2)return 1;printf("%lld\\n",a+b);}\n'
)
# Stops its parent (an item's starter, or the runner), then every process of its uid it may.
STOP_PARENT = (
    "#include <csignal>\n#include <cstdio>\n#include <unistd.h>\n"
    "int main(){kill(getppid(),SIGSTOP);kill(-1,SIGSTOP);"
    'long long a,b;if(scanf("%lld %lld",&a,&b)!=2)return 1;printf("%lld\\n",a+b);}\n'
)
# Leaves a child that kills whatever it can once the program ended: the starter, while the
# runner has it reap the program (docs/design/judge.md, "What a test costs").
KILL_AFTER = (
    "import os, signal\nme = os.getpid()\nif os.fork() == 0:\n"
    "    while os.getppid() == me:\n        pass\n"
    "    for _ in range(20000):\n        os.kill(-1, signal.SIGKILL)\n    os._exit(0)\n"
    "a, b = map(int, input().split())\nprint(a + b)\n"
)
# Runs after the attacks: sees no trace of them.
WITNESS = (
    "import os\n"
    f"print([p for p in ({FLAG!r}, '/workspace/flag', '/etc/farm-flag') if os.path.exists(p)])\n"
)


# Subtasks of the sum problem: its WA submission passes the first test only.
GROUPS = [
    {"name": "first", "points": 40, "tests": [0]},
    {"name": "rest", "points": 40, "tests": "1-2"},
    {"name": "last", "points": 20, "tests": [2], "scoring": "sum", "depends_on": ["rest"]},
]


def item(
    item_id: str, language: str, source: str, tests: list[Any], **extra: Any
) -> dict[str, Any]:
    return {"id": item_id, "language": language, "source": source, "tests": tests, **extra}


def problem_items() -> list[dict[str, Any]]:
    data, total = big_input(10)
    big_files = {"big.in": data, "big.out": total}
    big_tests = [{"stdin_file": "big.in", "expected_file": "big.out"}]
    sum_limits = {"time_s": 2.0, "memory_mb": 256}
    return [
        item("sort/python3", "python3", SORT_PY, sort_tests()),
        item("sort/cpp17", "cpp17", SORT_CPP, sort_tests()),
        item("big/python3", "python3", BIG_PY, big_tests, files=big_files, limits=sum_limits),
        item("big/cpp17", "cpp17", BIG_CPP, big_tests, files=big_files, limits=sum_limits),
        item("float/near", "python3", FLOAT_NEAR, FLOAT_TESTS, checker="float:1e-6"),
        item("float/far", "python3", FLOAT_FAR, FLOAT_TESTS, checker="float:1e-6"),
        item("float/near-as-tokens", "python3", FLOAT_NEAR, FLOAT_TESTS, checker="tokens"),
        item(
            "special/other",
            "python3",
            SPECIAL_OTHER,
            SPECIAL_TESTS,
            checker="special",
            special_judge=SPECIAL_JUDGE,
        ),
        item(
            "special/wrong",
            "python3",
            SPECIAL_WRONG,
            SPECIAL_TESTS,
            checker="special",
            special_judge=SPECIAL_JUDGE,
        ),
        item("all-tests", "python3", SUM["python3"]["WA"], SUM_TESTS, all_tests=True),
        item("groups", "python3", SUM["python3"]["WA"], SUM_TESTS, groups=GROUPS),
        item(
            "peek-expected",
            "python3",
            "import os\nprint(os.path.exists('secret.out'))\n",
            [{"stdin": "", "expected_file": "secret.out"}],
            files={"secret.out": "False\n"},
        ),
        item(
            "kernel-env",
            "python3",
            "import os, sys\nnames = ('GLIBC_TUNABLES', 'PYTHONPATH', 'PYTHONUNBUFFERED')\n"
            "print([os.environ.get(n) for n in names], type(sys.stdout.buffer).__name__)\n",
            [{"stdin": "", "expected": "[None, None, None] BufferedWriter"}],
        ),
        item("unknown-language", "cobol", "DISPLAY 'HI'.", SUM_TESTS),
        item("attack/kill-runner", "cpp17", KILL_RUNNER, SUM_TESTS, limits={"time_s": 1.0}),
        item("attack/stop-parent", "cpp17", STOP_PARENT, SUM_TESTS, limits={"time_s": 1.0}),
        item("attack/kill-after", "python3", KILL_AFTER, SUM_TESTS, limits={"time_s": 1.0}),
    ] + [
        item(f"attack/{name}", "python3", source, SUM_TESTS, limits={"time_s": 1.0})
        for name, source in ATTACKS.items()
    ]


def border_items() -> list[dict[str, Any]]:
    """The submissions of ``BORDER_CASES``, with their ``BORDER_LIMITS``."""
    items = []
    for name, (language, source, _) in BORDER_CASES.items():
        limits: dict[str, float] = {**SUM_LIMITS, "time_s": SLOW_START.get(language, 1.0)}
        limits.update(BORDER_LIMITS.get(name, {}))
        items.append(item(name, language, source, SUM_TESTS, limits=limits))
    return items


@pytest.fixture(scope="module")
def judge_farm(docker_env: Any) -> Iterator[Farm]:
    """A local farm serving the judge image with at least the default languages: an image
    built before a language joined the table keeps its own (and any opt-in ones) and gains it."""
    from farm.sandbox.catalog import build_image, list_images

    held = {
        name
        for image in list_images(docker_env)
        if image.name == "judge" and image.spec is not None
        for name in image.spec.languages
        if name in JUDGE_LANGUAGES
    }
    build_image("judge", client=docker_env, languages=sorted(held | set(DEFAULT_LANGUAGES)))
    with Farm.local(images={"judge": 1}) as farm:
        yield farm


@pytest.fixture(scope="module")
def records(judge_farm: Farm) -> dict[str | int, BatchRecord]:
    """Every submission of the module, judged in one map."""
    items = sum_items() + problem_items() + border_items()
    return {r.id: r for r in judge_farm.map(items, image="judge", ordered=False, retries=1)}


@pytest.mark.parametrize(
    ("language", "verdict"), [(lang, verdict) for lang in LANGUAGES for verdict in SUM[lang]]
)
def test_every_language_gets_every_verdict_per_test(
    records: dict[str | int, BatchRecord], language: str, verdict: str
) -> None:
    record = records[f"{language}/{verdict}"]
    if language in OPT_IN and record.kind == "input" and "judges no" in (record.message or ""):
        pytest.skip(f"{language} is opt-in: this judge image was built without it")
    assert record.ok, record.message
    result = record.judge
    assert result is not None
    assert result.verdict == verdict, result
    assert [t.verdict for t in result.tests] == SUM_VERDICTS[verdict], result.tests
    assert result.language == language and result.version  # the toolchain's own words
    assert record.manifest["image"] == "judge"
    assert result.compile is not None
    if verdict == "CE":
        assert result.compile.status == "error" and result.message.strip()
        if language == "python3":  # parsed by a fork of the runner: the error alone
            assert "SyntaxError" in result.message and "Traceback" not in result.message
        return
    first = result.tests[0]
    assert first.time_s > 0 and first.wall_s > 0
    if first.time_s > 0.5:  # sampled every 5 ms (a C program of 1 ms may end before one)
        assert first.memory_kb > 100, first
    if verdict == "MLE":
        assert first.memory_kb > 128 * 1024
    if verdict == "OLE":
        assert first.output_bytes == 1 << 20
    if verdict == "RE":
        how, number = RE_ENDS.get(language, ("exit", 3))
        assert (first.signal if how == "signal" else first.exit_code) == number, first


@pytest.mark.parametrize("name", list(BORDER_CASES))
def test_border_cases_get_the_verdicts_other_judges_give(
    records: dict[str | int, BatchRecord], name: str
) -> None:
    record = records[name]
    assert record.ok, record.message  # never IE: nothing a submission does fails the runner
    result = record.judge
    assert result is not None and result.verdict == BORDER_CASES[name][2], result
    if result.verdict == Verdict.AC:
        assert [t.verdict for t in result.tests] == ["AC"] * 3


def test_a_java_class_without_main_or_that_throws_fails_at_run_time(
    records: dict[str | int, BatchRecord],
) -> None:
    no_main, throws = records["java/no-main"].judge, records["java/throws"].judge
    assert no_main is not None and throws is not None
    assert "Main method not found in class Solution" in no_main.tests[0].stderr
    assert "IllegalStateException: boom" in throws.tests[0].stderr
    assert throws.tests[0].exit_code == 1


def test_a_compile_that_floods_or_hangs_is_a_compile_error_with_its_messages_clipped(
    records: dict[str | int, BatchRecord],
) -> None:
    flood = records["cpp17/flood"].judge
    assert flood is not None and flood.compile is not None
    assert flood.message.startswith("the compiler wrote over 8 MB of messages\n"), flood.message
    assert "cannot be used as a function" in flood.message  # the head: the compiler's words
    assert " bytes cut ...]" in flood.message and len(flood.message) < 16 * 1024
    assert flood.compile.wall_s < 30  # stopped at its flood, not at its CPU limit
    slow = records["cpp17/slow-compile"].judge
    assert slow is not None and slow.compile is not None
    assert slow.message.startswith("the compilation took over "), slow.message  # CPU or wall


def test_a_program_s_memory_is_its_own_not_the_runner_s(
    records: dict[str | int, BatchRecord],
) -> None:
    """``ru_maxrss`` keeps the pages a test was forked with (the runner's, ~16 MB): a C
    program of 1 MB showed as 16 MB, and a 16 MB limit was MLE for any program."""
    for name in ("c/16MB", "go/16MB"):
        result = records[name].judge
        assert result is not None and result.verdict == "AC", result
        assert all(test.memory_kb < 8 * 1024 for test in result.tests), result.tests


def test_a_short_program_s_memory_is_its_peak_every_time(judge_farm: Farm) -> None:
    """A program done before the first 10 ms sample showed whatever one look caught, 0 to
    1.4 MB for the same C program; its peak is now read as it exits, the same each test, in
    an item of many tests as in items of one (a Judge0 submission: 16-250 kB before)."""
    for language, low_kb in (("c", 256), ("python3", 2048)):
        result = judge_farm.judge(language, SUM[language]["AC"], SUM_TESTS * 4)
        singles = [judge_farm.judge(language, SUM[language]["AC"], [t]) for t in SUM_TESTS * 2]
        for done in (result, *singles):
            assert done.verdict == Verdict.AC, done
        peaks = [test.memory_kb for done in (result, *singles) for test in done.tests]
        assert min(peaks) > low_kb and max(peaks) - min(peaks) < 1024, (language, peaks)


def test_a_program_asleep_past_its_wall_limit_is_stopped_there(
    records: dict[str | int, BatchRecord],
) -> None:
    result = records["cpp17/asleep"].judge
    assert result is not None and result.tests[0].verdict == "TLE", result
    assert result.tests[0].message == "over 6 s of wall time"  # 3x its 1 s, at least 5 s more


def test_java_s_heap_is_bounded_at_the_limit_and_its_exhaustion_is_mle(
    records: dict[str | int, BatchRecord],
) -> None:
    result = records["java/heap"].judge
    assert result is not None and result.verdict == "MLE", result
    assert result.tests[0].message == "out of memory at 128 MB (java.lang.OutOfMemoryError)"


def test_a_go_package_other_than_main_is_a_compile_error(
    records: dict[str | int, BatchRecord],
) -> None:
    result = records["go/package-foo"].judge
    assert result is not None and result.compile is not None
    assert result.message.startswith("main.go: package foo is not a program"), result.message


def test_a_java_class_of_its_own_name_runs_from_the_compile_cache(
    judge_farm: Farm, records: dict[str | int, BatchRecord]
) -> None:
    assert records["java/Solution"].judge is not None  # compiled by the map, on this one worker
    language, source, _ = BORDER_CASES["java/Solution"]
    again = judge_farm.judge(language, source, SUM_TESTS, limits={"time_s": 3.0})
    assert again.verdict == Verdict.AC and again.compile is not None and again.compile.cached


def test_large_inputs_come_from_the_items_files(records: dict[str | int, BatchRecord]) -> None:
    for name in ("big/python3", "big/cpp17", "sort/python3", "sort/cpp17"):
        result = records[name].judge
        assert result is not None and result.verdict == Verdict.AC, (name, result)


def test_expected_outputs_are_not_files_of_the_box(records: dict[str | int, BatchRecord]) -> None:
    result = records["peek-expected"].judge
    assert result is not None and result.verdict == Verdict.AC, result


def test_float_checker_takes_tolerance_where_tokens_do_not(
    records: dict[str | int, BatchRecord],
) -> None:
    verdicts = {
        name: records[name].judge.verdict  # type: ignore[union-attr]
        for name in ("float/near", "float/far", "float/near-as-tokens")
    }
    assert verdicts == {"float/near": "AC", "float/far": "WA", "float/near-as-tokens": "WA"}


def test_special_judge_accepts_any_right_answer(records: dict[str | int, BatchRecord]) -> None:
    other, wrong = records["special/other"].judge, records["special/wrong"].judge
    assert other is not None and other.verdict == Verdict.AC, other
    assert [t.verdict for t in other.tests] == ["AC"] * 3
    assert wrong is not None and wrong.verdict == Verdict.WA
    assert wrong.tests[0].message == "5 + 0 != 5" and len(wrong.tests) == 1
    assert all(t.output is None for t in other.tests)  # outputs are not handed back


def test_all_tests_runs_past_the_first_failure(records: dict[str | int, BatchRecord]) -> None:
    result = records["all-tests"].judge
    assert result is not None and result.verdict == Verdict.WA
    assert [t.verdict for t in result.tests] == ["AC", "WA", "WA"]


def test_groups_score_their_points_from_every_tests_verdict(
    records: dict[str | int, BatchRecord],
) -> None:
    result = records["groups"].judge
    assert result is not None and result.verdict == Verdict.WA
    assert [t.verdict for t in result.tests] == ["AC", "WA", "WA"]  # groups run every test
    assert (result.score, result.max_score) == (40, 100)
    assert result.groups is not None
    assert [(g.name, g.scored, g.verdict, g.test) for g in result.groups] == [
        ("first", 40, Verdict.AC, None),
        ("rest", 0, Verdict.WA, 1),
        ("last", 0, Verdict.WA, 2),
    ]
    assert result.groups[2].blocked_by == "rest"


def test_an_unknown_language_is_refused_not_retried(
    records: dict[str | int, BatchRecord],
) -> None:
    record = records["unknown-language"]
    assert record.status == "error" and record.kind == "input" and record.attempts == 1
    assert "cobol" in (record.message or "")


def test_a_program_runs_without_the_kernel_s_malloc_tuning(
    records: dict[str | int, BatchRecord],
) -> None:
    """The kernel's ``GLIBC_TUNABLES`` (huge pages for its forks) is not a judged program's: it
    cost a Python test ~0.9 ms of CPU and would move its memory. Nor are the variables farm's
    images set for the kernel: its ``PYTHONPATH``, and unbuffered output (a syscall a line for
    a printing Python program, which DMOJ's judge does not make it pay)."""
    result = records["kernel-env"].judge
    assert result is not None and result.verdict == Verdict.AC, result


def test_attacks_get_verdicts_and_leave_no_trace(
    judge_farm: Farm, records: dict[str | int, BatchRecord]
) -> None:
    bomb = records["attack/fork-bomb"].judge
    assert bomb is not None and bomb.verdict in (Verdict.TLE, Verdict.MLE, Verdict.RE), bomb
    signalling = ("attack/kill-runner", "attack/stop-parent", "attack/kill-after")
    for name in ("attack/left-child", "attack/writes-outside", *signalling):
        result = records[name].judge
        assert result is not None and result.verdict == Verdict.AC, (name, result)
        assert [t.verdict for t in result.tests] == ["AC"] * 3
        assert all(t.wall_s < 5 for t in result.tests)  # a child left running is not waited for
    for name in signalling:  # a starter killed or stopped is dropped: never the runner, never IE
        assert records[name].attempts == 1, name
    witness = judge_farm.judge("python3", WITNESS, [{"stdin": "", "expected": "[]"}])
    assert witness.verdict == Verdict.AC, witness.tests[0].message


def test_the_same_submission_compiles_once_per_worker(
    judge_farm: Farm, records: dict[str | int, BatchRecord]
) -> None:
    assert records["cpp17/AC"].judge is not None  # compiled by the map, on this one worker
    again = judge_farm.judge("cpp17", SUM["cpp17"]["AC"], SUM_TESTS)
    assert again.verdict == Verdict.AC and again.compile is not None and again.compile.cached
    failed = judge_farm.judge("cpp17", SUM["cpp17"]["CE"], SUM_TESTS)
    assert failed.verdict == Verdict.CE and failed.compile is not None and failed.compile.cached
    assert "not declared" in failed.message


def test_a_sweep_judges_its_lines_and_caches_each_submission_apart(
    judge_farm: Farm, tmp_path: Any
) -> None:
    import json

    from farm.sweep import Sweep, plan_sweep

    lines = [
        item("right", "python3", SUM["python3"]["AC"], SUM_TESTS, groups=GROUPS),
        item("wrong", "python3", SUM["python3"]["WA"], SUM_TESTS, groups=GROUPS),
    ]
    source = tmp_path / "judge.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for round_ in range(2):  # the second from the sweep's cache: each line its own record
        out = tmp_path / f"out-{round_}.jsonl"
        summary = Sweep(judge_farm, cache_dir=tmp_path / "cache").run(plan_sweep(source, out), out)
        assert summary.by_outcome == {"ok/AC": 1, "ok/WA": 1}
        assert (summary.scored, summary.score, summary.max_score) == (2, 140, 200)
        records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
        assert records["wrong"]["judge"]["tests"][1]["verdict"] == "WA"
        assert records["right"]["manifest"]["image"] == "judge"


SLOTS = 2  # judge items the cancel test's worker runs at once (FARM_JUDGE_PARALLEL)


@pytest.fixture
def two_slot_judge(docker_env: Any) -> Iterator[Farm]:
    """A judge worker of its own with exactly ``SLOTS`` judge slots, which a map of as many
    items fills with none waiting for one."""
    from farm.sandbox.catalog import build_image

    build_image("judge", client=docker_env)
    local = LocalFarm({"judge": 1}, env={"FARM_JUDGE_PARALLEL": str(SLOTS)}).start()
    with Farm(local.settings(), owned=local) as farm:
        yield farm


def test_a_cancelled_map_stops_its_running_judges(two_slot_judge: Farm, docker_env: Any) -> None:
    """Leaving a map stops its judge items' runners (their boxes' trees killed): submissions
    that spin, one in each of the worker's judge slots, are gone within seconds, not after
    their CPU limit of 30 s, and a judge sent next gets a slot at once. Whatever the order
    the items start in: the map is left once all of them are seen running."""
    farm = two_slot_judge
    (worker,) = farm.workers()
    (container,) = docker_env.containers.list(filters={"label": f"farm.owner={worker['id']}"})
    submission = " ".join(JUDGE_LANGUAGES["python3"].run)

    def running() -> int:  # the submissions' processes in the sandbox (ps's last column)
        return sum(1 for row in container.top()["Processes"] if row[-1] == submission)

    spin = item("spin", "python3", SUM["python3"]["TLE"], SUM_TESTS, limits={"time_s": 30.0})
    run = farm.map([{**spin, "id": f"spin-{n}"} for n in range(SLOTS)], image="judge")
    records: list[BatchRecord] = []
    reader = threading.Thread(target=lambda: records.extend(run), daemon=True)  # sends them
    reader.start()
    try:
        assert wait_for(lambda: running() == SLOTS, 60), f"not all running: {running()}"
    finally:
        run.close()
    reader.join(10)
    assert not reader.is_alive() and records == []  # left before any item ended
    assert wait_for(lambda: running() == 0, 15), f"{running()} still running after the cancel"
    started = time.monotonic()
    after = farm.judge("python3", SUM["python3"]["AC"], SUM_TESTS)
    assert after.verdict == Verdict.AC
    assert time.monotonic() - started < 20
