"""The Kattis problem package format (legacy and 2023-07) read into a ``Problem``.

``problem.yaml`` (validation or type, validator flags, limits; else ``.timelimit``), tests
``data/sample`` then ``data/secret`` (``.in`` with ``.ans``, sorted as problemtools walks
them), a custom validator as the ``checker_program`` or the ``interactor`` (protocol
``kattis``), the default validator as the built-in checker that judges alike, else a Python
copy of it (case-insensitive); a scoring problem's directories are groups. Refused whole with
a ``PackageError`` where farm would judge otherwise. docs/design/judge.md, "Problem packages".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from farm.judge.packages import Package, PackageError, program, read_text
from farm.judge.problems import Problem
from farm.models.judge import JudgeLimits, TestCase, TestGroup

VERSIONS = {"legacy", "2023-07-draft", "2023-07"}
LIMITS = {"memory": "memory_mb", "output": "output_mb", "compilation_time": "compile_time_s"}
DEFAULTS = {"memory": 1024, "output": 8, "compilation_time": 60}  # problemtools' (MiB, s)

# Kattis' default output validator (problemtools' default_validator.cc), as a special judge.
DEFAULT_VALIDATOR = """
import math as _math
import re as _re

_NUMBER = _re.compile(r"[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?")


def _float(token):
    if not _NUMBER.fullmatch(token):
        return None
    value = float(token)
    return value if _math.isfinite(value) else None


def _same(judge, team):
    if FLOATS:
        want = _float(judge)
        if want is not None:
            got = _float(team)
            if got is None:
                return "expected a float, got " + team[:30]
            error = abs(want - got)
            if error <= ABS_TOL or error <= REL_TOL * abs(want):
                return ""
            return "too large difference: judge " + judge[:30] + ", user " + team[:30]
    if judge == team or not CASE and judge.encode().lower() == team.encode().lower():
        return ""
    return "string tokens mismatch: judge " + judge[:30] + ", user " + team[:30]


def check(input, expected, output):
    if SPACE:
        judge, team = _re.split(r"(\\s+)", expected), _re.split(r"(\\s+)", output)
    else:
        judge, team = expected.split(), output.split()
    for index, (want, got) in enumerate(zip(judge, team)):
        if SPACE and index % 2:
            if want != got:
                return False, "space change error"
            continue
        why = _same(want, got)
        if why:
            return False, why
    if len(team) > len(judge):
        return False, "trailing output"
    if len(team) < len(judge):
        return False, "user EOF while judge had more output"
    return True, ""
"""


def read_kattis(root: Path) -> Package:
    config = _yaml(root / "problem.yaml")
    version = str(config.get("problem_format_version", "legacy"))
    if version not in VERSIONS:
        raise PackageError(f"unknown problem_format_version {version!r}", path="problem.yaml")
    if version == "legacy":
        validation = str(config.get("validation", "default")).split() or ["default"]
        custom = validation[0] == "custom"
        interactive = "interactive" in validation[1:]
        scoring = config.get("type") == "scoring" or "score" in validation[1:]
        flags = str(config.get("validator_flags") or "").split()
        validators = root / "output_validators"
    else:
        kinds = config.get("type", "pass-fail")
        kinds = kinds if isinstance(kinds, list) else str(kinds).split()
        interactive, scoring = "interactive" in kinds, "scoring" in kinds
        validators = root / "output_validator"
        custom = interactive or validators.is_dir()
        flags = []
    tests, names, dirs, group_flags = _tests(root / "data")
    flags += group_flags
    fields: dict[str, Any] = {"tests": tests, "limits": _limits(root, config)}
    if custom:
        if flags:  # JudgeProgram has no arguments: judging without them would be wrong
            raise PackageError("validator flags for a custom validator are not supported")
        validator = program(_one_program(validators), "kattis")
        if interactive:
            fields |= {"interactor": validator, "checker": "none"}
        else:
            fields |= {"checker": "program", "checker_program": validator}
    else:
        fields |= _default_validator(flags, tests)
    if scoring:
        fields["groups"] = _groups(dirs)
    try:
        return Package(Problem.model_validate(fields), names, "kattis")
    except ValueError as exc:
        raise PackageError(f"not a problem farm can judge: {exc}", path=str(root)) from None


def _yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(read_text(path)) or {}
    except yaml.YAMLError as exc:
        raise PackageError(f"not YAML: {exc}", path=str(path)) from None
    if not isinstance(data, dict):
        raise PackageError("not a mapping of keys to values", path=str(path))
    return data


def _limits(root: Path, config: dict[str, Any]) -> JudgeLimits:
    given = config.get("limits") or {}
    if not isinstance(given, dict):
        raise PackageError("'limits' is not a mapping", path="problem.yaml")
    limits: dict[str, Any] = {
        ours: given.get(theirs, DEFAULTS[theirs]) for theirs, ours in LIMITS.items()
    }
    if "time_limit" in given:
        limits["time_s"] = given["time_limit"]
    elif (root / ".timelimit").is_file():
        limits["time_s"] = read_text(root / ".timelimit").strip()
    try:
        return JudgeLimits.model_validate(limits)
    except ValueError as exc:
        raise PackageError(f"bad limits: {exc}", path="problem.yaml") from None


def _tests(
    data: Path,
) -> tuple[list[TestCase], list[str], dict[str, tuple[list[int], dict[str, Any]]], list[str]]:
    """The tests (sample, then secret) and their names, the directories holding them (name ->
    their indices and testdata.yaml, inherited), and the output validator flags all groups
    share."""
    tests: list[TestCase] = []
    names: list[str] = []
    dirs: dict[str, tuple[list[int], dict[str, Any]]] = {}
    flags: set[tuple[str, ...]] = set()

    def walk(directory: Path, name: str, inherited: dict[str, Any]) -> None:
        config = dict(inherited)
        if (directory / "testdata.yaml").is_file():
            config |= _yaml(directory / "testdata.yaml")
        given = config.get("output_validator_flags") or config.get("output_validator_args") or ""
        flags.add(tuple(given if isinstance(given, list) else str(given).split()))
        for entry in sorted(directory.iterdir(), key=lambda p: p.name):
            if entry.is_dir():
                walk(entry, f"{name}/{entry.name}", config)
            elif entry.suffix == ".ans" and entry.with_suffix(".in").is_file():
                stdin = read_text(entry.with_suffix(".in"))
                tests.append(TestCase(stdin=stdin, expected=read_text(entry)))
                names.append(f"data/{name}/{entry.stem}")
                dirs.setdefault(name, ([], config))[0].append(len(tests) - 1)

    top = _yaml(data / "testdata.yaml") if (data / "testdata.yaml").is_file() else {}
    for part in ("sample", "secret"):
        if (data / part).is_dir():
            walk(data / part, part, top)
    if not tests:
        raise PackageError(
            "no tests: no .in file with its .ans under sample/ or secret/", path=str(data)
        )
    if len(flags) > 1:
        raise PackageError(
            "groups with different output_validator_flags are not supported", path=str(data)
        )
    return tests, names, dirs, list(flags.pop()) if flags else []


def _one_program(validators: Path) -> Path:
    if not validators.is_dir():
        raise PackageError("a custom validation needs its validator", path=str(validators))
    entries = [p for p in sorted(validators.iterdir()) if not p.name.startswith(".")]
    if len(entries) == 1:
        return entries[0]
    if any(p.is_dir() for p in entries):
        names = ", ".join(p.name for p in entries)
        raise PackageError(f"one output validator expected, found: {names}", path=str(validators))
    return validators  # the 2023-07 format's one program, its files right there


def _default_validator(flags: list[str], tests: list[TestCase]) -> dict[str, Any]:
    """A built-in checker judging as Kattis' default validator with ``flags`` would, else
    farm's copy of that validator as a special judge."""
    case = space = False
    absolute = relative = -1.0
    words = iter(flags)
    for flag in words:
        if flag == "case_sensitive":
            case = True
        elif flag == "space_change_sensitive":
            space = True
        elif flag in ("float_tolerance", "float_absolute_tolerance", "float_relative_tolerance"):
            try:
                value = float(next(words))
            except (StopIteration, ValueError):
                raise PackageError(
                    f"validator flag {flag} needs a number", path="problem.yaml"
                ) from None
            if flag != "float_relative_tolerance":
                absolute = value
            if flag != "float_absolute_tolerance":
                relative = value
        else:
            raise PackageError(f"unknown validator flag {flag!r}", path="problem.yaml")
    floats = absolute >= 0 or relative >= 0
    # Case-insensitive tokens compare as case-sensitive ones where no answer has a letter.
    lettered = any(any(c.isascii() and c.isalpha() for c in t.expected or "") for t in tests)
    if not space and (case or not lettered):
        if floats:
            return {"checker": f"float:{max(absolute, 0.0)!r}:{max(relative, 0.0)!r}"}
        return {"checker": "tokens"}
    constants = f"CASE = {case}\nSPACE = {space}\nFLOATS = {floats}\n"
    constants += f"ABS_TOL = {absolute!r}\nREL_TOL = {relative!r}\n"
    return {"checker": "special", "special_judge": constants + DEFAULT_VALIDATOR}


def _groups(dirs: dict[str, tuple[list[int], dict[str, Any]]]) -> list[TestGroup]:
    """A scoring problem's groups: each directory of tests, worth ``accept_score`` (1 unless
    its testdata.yaml says) per test, or once for all with ``grader_flags: min``."""
    groups = []
    for name, (tests, config) in dirs.items():
        scoring = "min" if "min" in str(config.get("grader_flags") or "").split() else "sum"
        try:
            score = float(config.get("accept_score", 1))
        except (TypeError, ValueError):
            raise PackageError(
                f"{name}: accept_score is not a number", path="testdata.yaml"
            ) from None
        points = score if scoring == "min" else score * len(tests)
        groups.append(TestGroup(name=name, points=points, tests=tests, scoring=scoring))
    return groups
