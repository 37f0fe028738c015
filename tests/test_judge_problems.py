"""Problems stored by digest and read from packages, without a sandbox: the digest's
stability, what the store takes and refuses (a real Redis), what a judge item naming a
stored problem carries (none of its tests), the worker's LRU, and the Kattis and Polygon
readers on the packages under tests/problems (written for these tests in those formats)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from farm.client.map_records import chunk_item
from farm.errors import ProblemError, ProblemNotFound, ProblemTooLarge
from farm.judge import problems
from farm.judge.packages import PackageError, language_of, open_package, read_package
from farm.judge.problems import Problem
from farm.judge.specs import build_step, judge_spec
from farm.kernel.judge import checkers
from farm.models.batch import BatchItem
from farm.models.judge import JudgeProgram, TestGroup
from farm.worker.stored_problems import StoredProblems

PACKAGES = Path(__file__).parent / "problems"
SUM = {
    "tests": [{"stdin": "1 2\n", "expected": "3\n"}, {"stdin": "2 2\n", "expected": "4\n"}],
    "checker": "tokens",
    "limits": {"time_s": 1.5},
}


def test_the_digest_is_over_the_content_only() -> None:
    one = Problem.model_validate(SUM)
    again = Problem.model_validate({"limits": {"time_s": 1.5}, **SUM})  # another key order
    defaults = Problem.model_validate({**SUM, "special_judge": None, "groups": None})
    assert one.digest == again.digest == defaults.digest
    assert problems.DIGEST.match(one.digest)
    # Pinned: a change of the canonical form would orphan every stored problem.
    assert one.canonical == (
        b'{"limits":{"time_s":1.5},"tests":[{"expected":"3\\n","stdin":"1 2\\n"},'
        b'{"expected":"4\\n","stdin":"2 2\\n"}]}'
    )
    other = Problem.model_validate({**SUM, "checker": "exact"})
    assert other.digest != one.digest
    assert one.model_copy(update={"checker": "exact"}).digest == other.digest  # not one's
    ranges = Problem.model_validate({**SUM, "groups": [{"name": "a", "points": 1, "tests": "0-1"}]})
    lists = Problem.model_validate({**SUM, "groups": [{"name": "a", "points": 1, "tests": [0, 1]}]})
    assert ranges.digest == lists.digest


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"tests": []}, "at least 1"),
        ({"checker": "program"}, "needs 'checker_program'"),
        ({"checker": "nope"}, "unknown checker"),
        ({"groups": [{"name": "a", "points": 1, "tests": [5]}]}, "out of range"),
    ],
)
def test_a_bad_problem_is_refused(fields: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        Problem.model_validate({**SUM, **fields})


def item(**fields: Any) -> dict[str, Any]:
    return {"id": 1, "language": "python3", "source": "print(3)", **fields}


def test_an_item_naming_a_stored_problem_carries_none_of_its_tests() -> None:
    problem = Problem.model_validate(SUM)
    stored = BatchItem.model_validate(item(problem=problem.digest, limits={"time_s": 0.5}))
    chunk = chunk_item(0, "exec", stored, 30.0)
    assert chunk.submission is not None and chunk.submission.problem == problem.digest
    assert chunk.judge is None and chunk.files == {}
    body = chunk.model_dump_json()
    assert "1 2" not in body and '"tests"' not in body
    inline = chunk_item(0, "exec", BatchItem.model_validate(item(**SUM)), 30.0)
    assert len(body) < len(inline.model_dump_json())
    # The worker builds the same step from either; the item's limits over the problem's.
    spec, _, _ = build_step(problem, chunk.submission)
    assert spec["time_s"] == 0.5 and spec["memory_mb"] == 256 and len(spec["tests"]) == 2
    assert judge_spec(BatchItem.model_validate(item(**SUM)))[0]["time_s"] == 1.5


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"problem": "sha256:abc"}, "not a problem digest"),
        ({"problem": "sha256:" + "0" * 64, **SUM}, "takes these from it"),
        ({"problem": "sha256:" + "0" * 64, "checker": "exact"}, "takes these from it"),
    ],
)
def test_an_item_with_a_problem_takes_its_tests_from_it(fields: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        BatchItem.model_validate(item(**fields))


def test_the_store_keeps_a_problem_once_and_refuses_a_large_one(redis_server: Any) -> None:
    client = redis_server.client()
    problem = Problem.model_validate(SUM)
    client.delete(problems.key(problem.digest))
    assert problems.put(client, problem) == problem.digest
    assert client.get(problems.key(problem.digest)) == problem.canonical
    assert 0 < client.ttl(problems.key(problem.digest)) <= problems.TTL_S
    assert problems.fetch(client, problem.digest) == problem
    big = Problem.model_validate(
        {"tests": [{"stdin": "x" * (problems.MAX_BYTES + 1)}], "checker": "none"}
    )
    with pytest.raises(ProblemTooLarge, match="over the"):
        problems.put(client, big)
    assert not client.exists(problems.key(big.digest))
    with pytest.raises(ProblemNotFound, match="sha256:0000"):
        problems.fetch(client, "sha256:" + "0" * 64)
    client.set(problems.key("sha256:" + "1" * 64), problem.canonical)  # not its name's bytes
    with pytest.raises(ProblemError, match="does not match its digest"):
        problems.fetch(client, "sha256:" + "1" * 64)
    unreadable = b'{"tests":[],"new_field":1}'  # its own name, but no Problem of this farm
    name = "sha256:" + hashlib.sha256(unreadable).hexdigest()
    client.set(problems.key(name), unreadable)
    with pytest.raises(ProblemError, match="cannot be read here"):
        problems.fetch(client, name)


@pytest.mark.parametrize("decoded", [False, True])  # farm's registry decodes its responses
def test_a_worker_reads_a_stored_problem_once(redis_server: Any, decoded: bool) -> None:
    client = redis_server.client(decode_responses=decoded)
    problem = Problem.model_validate({**SUM, "checker": "lines"})
    problems.put(client, problem)
    store = StoredProblems(client)
    assert store.get(problem.digest) == problem
    client.delete(problems.key(problem.digest))  # the LRU has it: Redis is not asked
    assert store.get(problem.digest) == problem and store.fetches == 1
    small = StoredProblems(client, limit=1)  # too small to keep it
    with pytest.raises(ProblemNotFound):
        small.get(problem.digest)


# --- packages ---------------------------------------------------------------------------


def test_a_kattis_package_with_the_default_validator() -> None:
    package = open_package(PACKAGES / "kattis_sum")
    assert package.format == "kattis"
    assert package.names == ["data/sample/1", "data/secret/01", "data/secret/02"]
    problem = package.problem
    assert [t.stdin for t in problem.tests] == ["1 2\n", "10 -4\n", "1000000000 1000000000\n"]
    assert [t.expected for t in problem.tests] == ["3\n", "6\n", "2000000000\n"]
    assert problem.checker == "tokens"  # no letter in any answer: case does not matter
    assert problem.limits is not None
    assert (problem.limits.time_s, problem.limits.memory_mb) == (1.5, 128)
    assert problem.groups is None and problem.checker_program is None


def test_the_default_validator_is_case_insensitive() -> None:
    problem = read_package(PACKAGES / "kattis_parity")
    assert problem.checker == "special" and problem.special_judge is not None
    scope: dict[str, Any] = {}
    exec(problem.special_judge, scope)  # the special judge's code, as its box runs it
    check = scope["check"]
    assert check("4\n", "Even 2.0\n", "even 2.0000001\n") == (True, "")
    assert check("4\n", "Even 2.0\n", "EVEN   2\n")[0] is True
    assert check("4\n", "Even 2.0\n", "Even 2.1\n")[0] is False
    assert check("4\n", "Even 2.0\n", "Even\n") == (False, "user EOF while judge had more output")
    assert check("4\n", "Even 2.0\n", "Even 2 x\n") == (False, "trailing output")


def test_a_kattis_custom_validator_is_the_checker_program() -> None:
    problem = read_package(PACKAGES / "kattis_anysum")
    assert problem.checker == "program"
    program = problem.checker_program
    assert program is not None
    assert (program.language, program.protocol) == ("cpp17", "kattis")
    assert '#include "validate.h"' not in program.source  # its header inlined: one source
    assert "const int AC = 42" in program.source and "int main" in program.source


def test_a_kattis_interactive_problem_has_an_interactor() -> None:
    problem = read_package(PACKAGES / "kattis_guess")
    assert problem.interactor is not None
    assert (problem.interactor.language, problem.interactor.protocol) == ("python3", "kattis")
    assert problem.checker == "none" and problem.checker_program is None
    assert [t.stdin for t in problem.tests] == ["42\n", "1\n", "100\n"]
    assert problem.limits is not None
    assert (problem.limits.time_s, problem.limits.memory_mb) == (1.0, 1024)  # problemtools'
    assert (problem.limits.output_mb, problem.limits.compile_time_s) == (8, 60)


def test_the_legacy_custom_interactive_validation(tmp_path: Path) -> None:
    package = shutil.copytree(PACKAGES / "kattis_anysum", tmp_path / "p")
    (package / "problem.yaml").write_text("validation: custom interactive\n")
    problem = read_package(package)
    assert problem.interactor is not None and problem.interactor.protocol == "kattis"
    assert problem.checker_program is None


def test_custom_validator_flags_are_refused_not_dropped(tmp_path: Path) -> None:
    package = shutil.copytree(PACKAGES / "kattis_anysum", tmp_path / "p")
    (package / "data/testdata.yaml").write_text("output_validator_args: [strict]\n")
    with pytest.raises(PackageError, match="flags for a custom validator"):
        read_package(package)


def test_a_kattis_scoring_problem_has_its_directories_as_groups() -> None:
    problem = read_package(PACKAGES / "kattis_scoring")
    assert problem.groups == [
        TestGroup(name="sample", points=0, tests=[0], scoring="sum"),
        TestGroup(name="secret/group1", points=40, tests=[1, 2]),
        TestGroup(name="secret/group2", points=60, tests=[3]),
    ]


def test_a_polygon_package_with_groups_and_a_testlib_checker() -> None:
    package = open_package(PACKAGES / "polygon_sum")
    assert (package.format, package.names[0], package.names[-1]) == (
        "polygon",
        "tests/01",
        "tests/05",
    )
    problem = package.problem
    assert len(problem.tests) == 5 and problem.tests[1].expected == "-5\n"
    assert problem.limits is not None
    assert (problem.limits.time_s, problem.limits.memory_mb) == (1.5, 256)
    assert problem.checker == "program"
    assert problem.checker_program == JudgeProgram(
        language="cpp17",
        source=(PACKAGES / "polygon_sum/files/check.cpp").read_text(),
        protocol="testlib",
    )
    assert problem.groups == [
        TestGroup(name="samples", points=0, tests=[0], scoring="sum"),
        TestGroup(name="small", points=30, tests=[1, 2], depends_on=["samples"]),
        TestGroup(name="large", points=0, tests=[3, 4], depends_on=["small"]),
        TestGroup(name="large#4", points=10, tests=[3], depends_on=["small"]),
        TestGroup(name="large#5", points=60, tests=[4], depends_on=["small"]),
    ]


def test_polygon_standard_checkers_map_to_built_in_ones(tmp_path: Path) -> None:
    package = shutil.copytree(PACKAGES / "polygon_sum", tmp_path / "p")
    xml = (package / "problem.xml").read_text()
    xml = xml.replace('<checker type="testlib">', '<checker name="std::rcmp6.cpp" type="testlib">')
    (package / "problem.xml").write_text(xml)
    problem = read_package(package)
    assert problem.checker == "float:1e-6:1e-6" and problem.checker_program is None
    checkers.parse(problem.checker)


def test_generated_polygon_tests_missing_from_the_package_are_named(tmp_path: Path) -> None:
    package = shutil.copytree(PACKAGES / "polygon_sum", tmp_path / "p")
    (package / "tests/03").unlink()
    (package / "tests/05.a").unlink()
    with pytest.raises(PackageError, match=r"tests 3, 5 are generated .* full package"):
        read_package(package)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            ("problem.yaml", "validation: default\nvalidator_flags: float_tolerance\n"),
            "needs a number",
        ),
        (
            ("problem.yaml", "validation: default\nvalidator_flags: shout\n"),
            "unknown validator flag",
        ),
        (("problem.yaml", "validation: custom\n"), "needs its validator"),
        (("problem.yaml", "problem_format_version: 1999\n"), "unknown problem_format_version"),
        (("problem.yaml", "- a list\n"), "not a mapping"),
        (("data/secret/01.in", b"\xff\xfe"), "not UTF-8"),
    ],
)
def test_a_bad_kattis_package_is_refused(tmp_path: Path, change: tuple[str, Any], why: str) -> None:
    package = shutil.copytree(PACKAGES / "kattis_sum", tmp_path / "p")
    name, content = change
    if isinstance(content, bytes):
        (package / name).write_bytes(content)
    else:
        (package / name).write_text(content)
    with pytest.raises(PackageError, match=why):
        read_package(package)


def test_not_a_package(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match="not a problem package"):
        read_package(tmp_path)


@pytest.mark.parametrize(
    ("name", "language"),
    [
        ("a.cpp", "cpp17"),
        ("a.cc", "cpp17"),
        ("A.java", "java17"),
        ("a.py", "python3"),
        ("a.x", None),
    ],
)
def test_a_language_from_a_file_name(name: str, language: str | None) -> None:
    assert language_of(name) == language
