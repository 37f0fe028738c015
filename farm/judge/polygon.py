"""Polygon (Codeforces) packages read into a ``Problem``: ``problem.xml``'s testset ``tests``
(``time-limit`` in ms, ``memory-limit`` in bytes, ``input-path-pattern`` and
``answer-path-pattern`` such as ``tests/%02d`` and ``tests/%02d.a``, one ``<test>`` each with
its ``method``, ``group`` and ``points``), its ``<groups>`` (``points``, ``points-policy``
``complete-group`` or ``each-test``, ``<dependencies>``), the checker and the interactor.

A generated test (``method="generated"``) is in a package only once Polygon ran its
generator: "full" packages hold them; one that is missing is refused with the tests named.
The standard checkers that a built-in checker judges alike are mapped to it (``std::wcmp.cpp``
is ``tokens``); any other checker runs from its source (testlib).
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from farm.judge.packages import Package, PackageError, program, read_text
from farm.judge.problems import Problem
from farm.models.judge import JudgeLimits, JudgeProgram, TestCase, TestGroup

# Standard checkers (testlib's checkers/*.cpp) that a built-in checker judges the same way.
STANDARD = {
    "std::wcmp.cpp": "tokens",  # sequences of tokens
    "std::ncmp.cpp": "tokens",  # sequences of integers
    "std::rcmp4.cpp": "float:1e-4:1e-4",  # doubles, absolute or relative error 1e-4
    "std::rcmp6.cpp": "float:1e-6:1e-6",
    "std::rcmp9.cpp": "float:1e-9:1e-9",
}
LANGUAGES = {"cpp.g++20": "cpp20", "cpp.gcc13-64-winlibs-g++20": "cpp20", "python.3": "python3"}


def read_polygon(root: Path) -> Package:
    try:
        xml = ET.fromstring(read_text(root / "problem.xml"))
    except ET.ParseError as exc:
        raise PackageError(f"not XML: {exc}", path="problem.xml") from None
    judging = xml.find("judging")
    if judging is None:
        raise PackageError("no <judging>", path="problem.xml")
    for stream in ("input-file", "output-file"):
        if judging.get(stream):
            why = f"the problem's {stream} is {judging.get(stream)!r}: file I/O is not supported"
            raise PackageError(why, path="problem.xml")
    testsets = judging.findall("testset")
    testset = next((t for t in testsets if t.get("name") == "tests"), None)
    if testset is None:
        raise PackageError('no <testset name="tests">', path="problem.xml")
    tests_xml = testset.findall("tests/test")
    fields: dict[str, Any] = {
        "tests": _tests(root, testset, tests_xml),
        "limits": _limits(testset),
        **_checker(root, xml),
    }
    interactor = xml.find("assets/interactor/source")
    if interactor is not None:
        fields["interactor"] = _program(root, interactor)
    groups = _groups(testset, tests_xml)
    if groups:
        fields["groups"] = groups
    try:
        problem = Problem.model_validate(fields)
    except ValueError as exc:
        raise PackageError(f"not a problem farm can judge: {exc}", path=str(root)) from None
    inputs = testset.findtext("input-path-pattern") or "tests/%02d"
    return Package(problem, [inputs % n for n in range(1, len(tests_xml) + 1)], "polygon")


def _number(testset: ET.Element, tag: str) -> float | None:
    text = testset.findtext(tag)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise PackageError(f"<{tag}> is not a number: {text!r}", path="problem.xml") from None


def _limits(testset: ET.Element) -> JudgeLimits:
    limits: dict[str, Any] = {}
    time_ms = _number(testset, "time-limit")
    if time_ms is not None:
        limits["time_s"] = time_ms / 1000
    memory = _number(testset, "memory-limit")
    if memory is not None:
        limits["memory_mb"] = max(16, math.ceil(memory / (1 << 20)))
    try:
        return JudgeLimits.model_validate(limits)
    except ValueError as exc:
        raise PackageError(f"bad limits: {exc}", path="problem.xml") from None


def _tests(root: Path, testset: ET.Element, tests_xml: list[ET.Element]) -> list[TestCase]:
    inputs = testset.findtext("input-path-pattern") or "tests/%02d"
    answers = testset.findtext("answer-path-pattern") or "tests/%02d.a"
    if not tests_xml:
        raise PackageError("the testset has no tests", path="problem.xml")
    missing: dict[str, list[int]] = {}
    for number, test in enumerate(tests_xml, 1):
        for pattern in (inputs, answers):
            if not (root / (pattern % number)).is_file():
                method = "generated" if test.get("method") == "generated" else "manual"
                missing.setdefault(method, []).append(number)
                break
    if missing.get("generated"):
        numbers = ", ".join(map(str, missing["generated"]))
        raise PackageError(
            f'tests {numbers} are generated (method="generated") and their files are not in '
            "the package: use a full package, which holds generated tests and their answers",
            path=str(root),
        )
    if missing.get("manual"):
        numbers = ", ".join(map(str, missing["manual"]))
        raise PackageError(f"the input or answer of tests {numbers} is missing", path=str(root))
    return [
        TestCase(stdin=read_text(root / (inputs % n)), expected=read_text(root / (answers % n)))
        for n in range(1, len(tests_xml) + 1)
    ]


def _program(root: Path, source: ET.Element) -> JudgeProgram:
    path = source.get("path")
    if not path:
        raise PackageError("a <source> without a path", path="problem.xml")
    kind = source.get("type", "")
    return program(root / path, "testlib", LANGUAGES.get(kind))


def _checker(root: Path, problem: ET.Element) -> dict[str, Any]:
    checker = problem.find("assets/checker")
    if checker is None:
        return {"checker": "tokens"}  # Polygon's default: wcmp
    name = checker.get("name", "")
    if name in STANDARD:
        return {"checker": STANDARD[name]}
    source = checker.find("source")
    if source is None:
        raise PackageError(f"the checker {name!r} has no <source>", path="problem.xml")
    return {"checker": "program", "checker_program": _program(root, source)}


def _groups(testset: ET.Element, tests_xml: list[ET.Element]) -> list[TestGroup]:
    """Polygon's groups: ``complete-group`` is all or nothing (``min``), ``each-test`` a
    share per test passed (``sum``; tests of unequal points get a group each, beside a
    0-point group that others may depend on); points on tests without groups, a group each."""
    members: dict[str, list[int]] = {}
    points: list[float] = []
    for index, test in enumerate(tests_xml):
        points.append(float(test.get("points") or 0))
        if test.get("group") is not None:
            members.setdefault(test.get("group", ""), []).append(index)
    declared = testset.findall("groups/group")
    if not declared:  # points without groups: each test its own
        return [
            TestGroup(name=f"test {i + 1}", points=p, tests=[i]) for i, p in enumerate(points) if p
        ]
    unknown = sorted(set(members) - {g.get("name", "") for g in declared})
    if unknown:
        why = f"tests name undeclared groups: {', '.join(unknown)}"
        raise PackageError(why, path="problem.xml")
    groups = []
    for group in declared:
        name = group.get("name", "")
        tests = members.get(name, [])
        if not tests:
            continue
        depends = [d.get("group", "") for d in group.findall("dependencies/dependency")]
        depends = [d for d in depends if members.get(d)]
        own = [points[i] for i in tests]
        total = float(group.get("points") or sum(own))
        if group.get("points-policy") != "each-test":
            groups.append(TestGroup(name=name, points=total, tests=tests, depends_on=depends))
        elif len(set(own)) <= 1:
            groups.append(
                TestGroup(name=name, points=total, tests=tests, scoring="sum", depends_on=depends)
            )
        else:
            groups.append(TestGroup(name=name, points=0, tests=tests, depends_on=depends))
            groups += [
                TestGroup(name=f"{name}#{i + 1}", points=points[i], tests=[i], depends_on=depends)
                for i in tests
            ]
    if not any(group.points for group in groups):
        return []  # no points: pass or fail, every test run only until one fails
    return groups
