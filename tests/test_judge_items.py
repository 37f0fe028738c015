"""The judge's pure parts, without a sandbox: the checkers, what a judge item accepts, what it
becomes on its way to a worker, how a source names its program, how a compile's messages are
clipped, and how verdicts read as Judge0 statuses."""

from __future__ import annotations

import base64
import os

import pytest
from pydantic import ValidationError

from farm.judge.languages import LANGUAGES
from farm.judge.specs import judge_spec
from farm.kernel.boxes import pycheck
from farm.kernel.boxes.testrun import read_all
from farm.kernel.judge import checkers, entries
from farm.models.batch import BatchItem, BatchRecord
from farm.models.judge import JudgeResult, TestResult, Verdict
from farm.serve.judge0_view import status_of


@pytest.mark.parametrize(
    ("checker", "expected", "actual", "passes"),
    [
        ("exact", b"3\n", b"3\n", True),
        ("exact", b"3\n", b"3", False),
        ("lines", b"a b\nc\n", b"a b  \nc\n\n", True),
        ("lines", b"a b\nc\n", b"a  b\nc\n", False),
        ("tokens", b"1 2\n3", b" 1\n2   3 \n", True),
        ("tokens", b"1 2 3", b"1 2", False),
        ("float:1e-6", b"1.4142135", b"1.41421356", True),
        ("float:1e-6", b"1.4142135", b"1.4143", False),
        ("float:0:0.01", b"1000", b"1009", True),
        ("float:1e-6", b"nan x", b"nan x", True),
        ("float:1e-6", b"abc", b"abd", False),
        ("none", b"anything", b"else", True),
    ],
)
def test_checkers(checker: str, expected: bytes, actual: bytes, passes: bool) -> None:
    assert checkers.check(checker, expected, actual)[0] is passes


def test_a_failed_check_says_where() -> None:
    assert checkers.check("tokens", b"1 2", b"1 5") == (
        False,
        "token 2 differs: expected '2', got '5'",
    )


@pytest.mark.parametrize("name", ["nope", "float:x", "tokens:1", "float:1:2:3", "float:-1"])
def test_unknown_checkers_are_refused(name: str) -> None:
    with pytest.raises(checkers.CheckerError):
        checkers.parse(name)


def item(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": 1,
        "language": "python3",
        "source": "print(1)",
        "tests": [{"stdin": "", "expected": "1"}],
    }
    return {**base, **fields}


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"checker": "nope"}, "unknown checker"),
        ({"checker": "special"}, "special_judge"),
        ({"tests": []}, "at least one test"),
        ({"tests": [{"stdin": "x"}]}, "no 'expected'"),
        ({"tests": [{"stdin_file": "in", "expected": "1"}]}, "not among the item's files"),
        ({"language": None}, "both 'language' and 'source'"),
        ({"code": "1"}, "exactly one of"),
        ({"limits": {"time_s": 0}}, "greater than 0"),
    ],
)
def test_bad_judge_items_are_refused(fields: dict[str, object], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        BatchItem.model_validate(item(**fields))


def test_a_judge_items_limits_are_per_test() -> None:
    parsed = BatchItem.model_validate(item(limits={"time_s": 1.5, "memory_mb": 64}))
    assert parsed.limits is None
    assert parsed.judge_limits is not None and parsed.judge_limits.memory_mb == 64


def test_expected_files_never_reach_the_box() -> None:
    parsed = BatchItem.model_validate(
        item(
            files={"in.txt": "1 2", "out.txt": "3", "data.txt": "x"},
            tests=[{"stdin_file": "in.txt", "expected_file": "out.txt"}],
        )
    )
    spec, files, timeout_s = judge_spec(parsed)
    assert set(files) == {"in.txt", "data.txt"}
    (test,) = spec["tests"]
    assert test == {"stdin_path": "in.txt", "expected": base64.b64encode(b"3").decode()}
    assert timeout_s > 2 * 30  # the compile's, then each test's wall limit


def result(verdict: Verdict, **test: object) -> BatchRecord:
    judged = JudgeResult(verdict=verdict, tests=[TestResult(verdict=verdict, **test)])  # type: ignore[arg-type]
    return BatchRecord(id=1, status="ok", judge=judged)


@pytest.mark.parametrize(
    ("record", "status"),
    [
        (result(Verdict.AC), 3),
        (result(Verdict.WA), 4),
        (result(Verdict.TLE), 5),
        (result(Verdict.CE), 6),
        (result(Verdict.RE, signal=11), 7),
        (result(Verdict.OLE), 8),
        (result(Verdict.RE, signal=8), 9),
        (result(Verdict.RE, signal=6), 10),
        (result(Verdict.RE, exit_code=3), 11),
        (result(Verdict.MLE), 12),
        (result(Verdict.IE), 13),
    ],
)
def test_verdicts_read_as_judge0_statuses(record: BatchRecord, status: int) -> None:
    assert status_of(record.judge, record) == status


MAIN = "{public static void main(String[] a){}}"


@pytest.mark.parametrize(
    ("source", "file", "main"),
    [
        (f"public class Solution{MAIN}", "Solution.java", "Solution"),
        (f"import java.util.*;\nfinal class A{MAIN}", "A.java", "A"),
        (f"public abstract strictfp class CF1234A{MAIN}", "CF1234A.java", "CF1234A"),
        (f"public class Решение{MAIN}", "Решение.java", "Решение"),
        (f"final public class \\u0041B{MAIN}", "AB.java", "AB"),  # javac's unicode escapes
        (f'@SuppressWarnings("all") public record R(int x){MAIN}', "R.java", "R"),
        (
            '// public class Foo\n/* public class Bar { */\nclass Helper{String s = "public class '
            "Baz {\"; char c = '\"';}\n"
            f'String t = """\n public class Qux {{\n""";\npublic class Real{MAIN}',
            "Real.java",
            "Real",
        ),
        (f"public class Sol{{int f(){{return 1;}}}}\nclass Runner{MAIN}", "Sol.java", "Runner"),
        ("public class Solution{static int f(){return 1;}}", "Solution.java", "Solution"),
        (f"class Outer{{static class Inner{MAIN}}}", "Main.java", "Main"),  # nested: not run
        ("class Quiet{}", "Main.java", "Main"),
        (f"package cf.round;\npublic class A{MAIN}", "A.java", "cf.round.A"),
    ],
)
def test_a_java_source_names_its_file_and_the_class_that_runs(
    source: str, file: str, main: str
) -> None:
    assert entries.find("java", source, "Main.java") == (file, main)


def test_a_java_class_name_too_long_for_a_file_is_a_compile_error() -> None:
    with pytest.raises(entries.EntryError, match="too long"):
        entries.find("java", f"public class {'A' * 300}{MAIN}", "Main.java")


@pytest.mark.parametrize(
    ("source", "package"),
    [
        ("package foo\nfunc main(){}", "foo"),
        ("\ufeff/* a library */ package lib", "lib"),
        ("// package foo\npackage main\nfunc main(){}", None),
        ("func main(){}", None),  # go build says what is missing
    ],
)
def test_only_a_go_package_main_is_a_program(source: str, package: str | None) -> None:
    if package is None:
        assert entries.find("go", source, "main.go") == ("main.go", "main")
        return
    with pytest.raises(entries.EntryError, match=f"package {package} is not a program"):
        entries.find("go", source, "main.go")


def test_a_language_without_a_rule_keeps_the_tables_file() -> None:
    assert entries.find(None, "public class Solution{}", "Main.java") == ("Main.java", "Main")


def test_a_long_output_is_kept_as_its_head_and_tail() -> None:
    data = bytes(range(256)) * 4
    fd = os.memfd_create("output")
    try:
        os.write(fd, data)
        clipped = data[:10] + b"\n[... 1009 bytes cut ...]\n" + data[-5:]
        assert read_all(fd, 10, 5) == (clipped, 1024)
        assert read_all(fd, 1000, 24) == (data, 1024)  # nothing to cut
        assert read_all(fd, 10) == (data[:10], 1024)  # a test's stdout: its head only
    finally:
        os.close(fd)


def test_pythons_check_is_the_one_the_runner_does_without_a_python_start() -> None:
    row = LANGUAGES["python3"]
    box = {"number": 1, "uid": 1, "gid": 1, "workspace": "/w", "tmp": "/t", "limits": {}}
    assert list(row.compile) == [*pycheck.CHECK_ARGV, row.file]
    assert pycheck.applies([*row.compile[:-1], "other.py"], box) in ("other.py", None)
    assert pycheck.applies(["python3", "-c", "pass", row.file], box) is None
