"""DMOJ's judge-server testsuite read as farm judge items (for ``bench/conformance.py``).

A DMOJ problem is ``init.yml`` (tests, maybe in a zip ``archive``, a checker, batches); each
of its cases is ``tests/<case>/test[.linux|.posix].yml`` (language, time, memory in KB,
source, ``expect`` or per-test ``cases``, ``score``). ``read_suite`` gives a ``Case`` per case
farm can judge as DMOJ does (bridged checkers and interactors: ``bench/dmoj_programs.py``), a
``Skip`` with the reason for every other. Nothing of DMOJ is copied: its files are read from
the checkout given at run time.
"""

from __future__ import annotations

import math
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dmoj_programs import judge_program

# DMOJ's executor -> the farm languages that run it, the first the image has wins. Rows of
# languages farm may gain later stay here: a name the image lacks is skipped ("no language").
LANGUAGES: dict[str, tuple[str, ...]] = {
    "C": ("c",),
    "C11": ("c",),
    "CPP03": ("cpp17",),
    "CPP11": ("cpp17",),
    "CPP14": ("cpp17",),
    "CPP17": ("cpp17",),
    "CPP20": ("cpp20", "cpp17"),
    "JAVA8": ("java17",),
    "JAVA11": ("java17",),
    "JAVA17": ("java17",),
    "JAVA": ("java17",),
    "GO": ("go",),
    "PY3": ("python3",),
    "PYPY3": ("pypy3",),
    "PY2": ("python2", "pypy2"),
    "PYPY2": ("pypy2",),
    "RUST": ("rust",),
    "V8JS": ("javascript",),
    "NODE": ("javascript",),
    "BASH": ("bash",),
    "PAS": ("pascal",),
    "MONOCS": ("csharp",),
    "KOTLIN": ("kotlin",),
    "RUBY": ("ruby",),
    "PHP": ("php",),
    "LUA": ("lua",),
    "PERL": ("perl",),
    "HASK": ("haskell",),
}
# DMOJ's built-in checkers -> farm's where they judge alike (floats: precision p, 10^-p).
CHECKERS = {"standard": "tokens", "identical": "exact", "linecount": "lines", "rstripped": "lines"}
FLOATS = {"floats": "float:{e}:{e}", "floatsabs": "float:{e}:0", "floatsrel": "float:0:{e}"}
# DMOJ's verdicts as farm's: IR (invalid return: an exception, a signal) and RTE are RE.
VERDICTS = {"RTE": "RE", "IR": "RE"}
PRINT_STATEMENT = re.compile(r"^[ \t]*print\b(?![ \t]*[(=])", re.MULTILINE)
MIN_MEMORY_MB = 16  # farm's floor (JudgeLimits.memory_mb)
COMPILE_TIME_S = 10.0  # DMOJ's default compiler_time_limit
OUTPUT_MB = 24  # DMOJ's default output_limit_length (25,165,824 bytes)
# Cases whose verdict rests on what DMOJ's own sandbox or runtime adds, not on the program.
SKIP_CASES = {
    "aplusb/cpp_io_symlinks": "reads DMOJ's 'symlinks' (in_link -> /dev/stdin) in its sandbox",
    "aplusb/java_bigdecimal": "hints: nobigmath, DMOJ's Java agent refusing BigDecimal",
    "aplusb/java_biginteger": "hints: nobigmath, DMOJ's Java agent refusing BigInteger",
    "helloworld/java_unsafe": "DMOJ's Java agent refusing sun.misc.Unsafe",
    "helloworld/sandbox_py3_bad_file": "DMOJ's file-access policy (/dev/full refused)",
}
# Problem keys farm has no counterpart for; the value says what is needed.
PROBLEM_FEATURES = {
    "generator": "tests made by a generator program (farm takes tests as data)",
    "custom_judge": "DMOJ's Python grader or interactor (custom_judge), DMOJ's own API",
    "signature_grader": "DMOJ's signature grader (a C entry linked with the submission)",
}


@dataclass
class Case:
    """One DMOJ case as one farm judge item, with the verdicts DMOJ expects."""

    name: str
    dmoj_language: str
    item: dict[str, Any]
    expect: set[str]  # every test's verdict is one of these (farm's names; SC: skipped)
    per_test: dict[int, set[str]] = field(default_factory=dict)  # from 1, DMOJ's "cases"
    batches: list[list[int]] = field(default_factory=list)  # test indices from 0
    depends: dict[int, list[int]] = field(default_factory=dict)  # batch -> batches it needs
    notes: list[str] = field(default_factory=list)
    score: float | None = None  # DMOJ's points for the case, when it says
    points: list[float] = field(default_factory=list)  # each test's points, DMOJ's


@dataclass
class Skip:
    name: str
    language: str
    reason: str


def _verdicts(codes: Any) -> set[str]:
    given = [codes] if isinstance(codes, str) else list(codes)
    return {VERDICTS.get(code, code) for code in given}


def _config(case_dir: Path) -> dict[str, Any]:
    """The case's config as DMOJ's tester on Linux reads it: the files merged in order."""
    config: dict[str, Any] = {}
    for name in ("test.yml", "test.posix.yml", "test.linux.yml"):
        path = case_dir / name
        if path.is_file():
            config.update(yaml.safe_load(path.read_text()) or {})
    if not config:  # a config under another name (init.yml in a case directory)
        for path in sorted(case_dir.glob("*.yml")):
            if "freebsd" not in path.name:
                config.update(yaml.safe_load(path.read_text()) or {})
    return config


class Problem:
    """A DMOJ problem directory: its tests as farm test cases, checker, batches."""

    def __init__(self, root: Path, languages: dict[str, str]) -> None:
        self.root = root
        self.languages = languages  # DMOJ's executor -> the image's language
        self.notes: list[str] = []
        self.judging: dict[str, Any] = {}
        self.name = root.name
        self.init: dict[str, Any] = yaml.safe_load((root / "init.yml").read_text()) or {}
        archive = self.init.get("archive")
        self.zip = zipfile.ZipFile(root / archive) if archive else None
        self.problem_skip = self._problem_skip()

    def _problem_skip(self) -> str | None:
        for key, reason in PROBLEM_FEATURES.items():
            if key in self.init:
                return reason
        if not isinstance(self.init.get("test_cases"), list):
            return "tests found by DMOJ's input_format regex over the archive"
        try:
            self.judging = self._judging()
        except (ValueError, KeyError) as error:
            return str(error)
        if self.init.get("unbuffered"):
            self.notes.append("DMOJ: unbuffered stdout")
        return None

    def _judging(self) -> dict[str, Any]:
        """The item's checker fields: a bridged checker or interactor as a farm program."""
        checker = self.init.get("checker")
        interactive = self.init.get("interactive")
        if isinstance(interactive, dict):
            made, note = judge_program(self.root, interactive, self.languages, "interactor")
            if checker:
                raise ValueError("an interactor and a checker after it")
            self.notes += [note] if note else []
            return {"interactor": made.model_dump(), "checker": "none"}
        if isinstance(checker, dict) and checker.get("name") == "bridged":
            made, note = judge_program(self.root, checker["args"], self.languages, "checker")
            self.notes += [note] if note else []
            return {"checker": "program", "checker_program": made.model_dump()}
        return {}

    def read(self, name: str) -> str:
        """A data file as DMOJ gives it: newlines (CRLF, CR) as LF, one at the end, unless
        the problem says ``binary_data``."""
        data = self.zip.read(name) if self.zip is not None else (self.root / name).read_bytes()
        if data and not self.init.get("binary_data"):
            data = data.replace(b"\r\n", b"\r").replace(b"\r", b"\n")
            data += b"" if data.endswith(b"\n") else b"\n"
        return data.decode()

    def checker(self) -> tuple[str, str | None]:
        """Farm's checker and special judge for the problem's, or ``ValueError``."""
        given = self.init.get("checker") or "standard"
        name = given.get("name") if isinstance(given, dict) else given
        args = given.get("args", {}) if isinstance(given, dict) else {}
        if name in CHECKERS:
            return CHECKERS[name], None
        if name in FLOATS:
            return FLOATS[name].format(e=f"1e-{int(args.get('precision', 6))}"), None
        if isinstance(name, str) and name.endswith(".py"):
            source = (self.root / name).read_text()
            if "dmoj.checkers" in source or "result" in re.findall(r"\*, (\w+)", source):
                raise ValueError("a DMOJ Python checker reading DMOJ's own result object")
            return "special", python_checker(source)
        raise ValueError(f"DMOJ's {name!r} checker has no farm built-in alike")

    def points(self) -> list[float]:
        """Each test's points (DMOJ's; a batch's on its first test)."""
        points: list[float] = []
        for entry in self.init["test_cases"]:
            count = len(entry["batched"]) if "batched" in entry else 1
            points += [float(entry.get("points", 0))] + [0.0] * (count - 1)
        return points

    def tests(self) -> tuple[list[dict[str, str]], list[list[int]], dict[int, list[int]]]:
        """The tests in order, the batches (test indices) and each batch's dependencies."""
        tests: list[dict[str, str]] = []
        batches: list[list[int]] = []
        depends: dict[int, list[int]] = {}
        for entry in self.init["test_cases"]:
            if "batched" in entry:
                start = len(tests)
                tests += [self._test(sub) for sub in entry["batched"]]
                depends[len(batches)] = [d - 1 for d in entry.get("dependencies", [])]
                batches.append(list(range(start, len(tests))))
            else:
                tests.append(self._test(entry))
        return tests, batches, depends

    def _test(self, entry: dict[str, Any]) -> dict[str, str]:
        test = {"stdin": self.read(entry["in"]) if "in" in entry else ""}
        if "out" in entry:
            test["expected"] = self.read(entry["out"])
        elif "expected" not in test:
            test["expected"] = ""
        return test


def python_checker(source: str) -> str:
    """A DMOJ Python checker (``check(process_output, judge_output, **kwargs)``) as farm's
    special judge (``check(input, expected, output)``), with a stand-in ``CheckerResult``."""
    return (
        "import sys, types\n"
        "class CheckerResult:\n"
        "    def __init__(self, passed, points=0, feedback='', extended_feedback=''):\n"
        "        self.passed, self.feedback = passed, feedback\n"
        "_result = types.ModuleType('dmoj.result')\n"
        "_result.CheckerResult = CheckerResult\n"
        "sys.modules['dmoj'] = types.ModuleType('dmoj')\n"
        "sys.modules['dmoj.result'] = _result\n"
        f"exec(compile({source!r}, 'checker.py', 'exec'), _ns := {{}})\n"
        "def check(input, expected, output):\n"
        "    got = _ns['check'](output.encode(), expected.encode(), judge_input=input.encode(),\n"
        "                       point_value=1, submission_source='', case=None)\n"
        "    if isinstance(got, CheckerResult):\n"
        "        return bool(got.passed), got.feedback or ''\n"
        "    return bool(got)\n"
    )


def _source(case_dir: Path, config: dict[str, Any]) -> str:
    source = config["source"]
    if not isinstance(source, str):
        raise ValueError("several sources")
    return (case_dir / source).read_text(encoding="utf-8")


def read_case(
    problem: Problem, case_dir: Path, languages: set[str], py2_as_py3: bool
) -> Case | Skip | None:
    """One case as a ``Case``, a ``Skip``, or ``None`` when DMOJ itself skips it on Linux."""
    config = _config(case_dir)
    name = f"{problem.name}/{case_dir.name}"
    if not config or config.get("skip") or config.get("arch") and "amd64" not in config["arch"]:
        return None
    dmoj = config["language"]
    language = next((lang for lang in LANGUAGES.get(dmoj, ()) if lang in languages), None)
    notes: list[str] = []
    source = _source(case_dir, config)
    missing = None
    if language is None and dmoj == "PY2" and py2_as_py3 and "python3" in languages:
        try:
            compile(source, "main.py", "exec")
            if PRINT_STATEMENT.search(source):  # print -1, 1 compiles, then fails
                raise SyntaxError("a print statement")
            language = "python3"
            notes.append("PY2 as python3")
        except SyntaxError:
            missing = "Python 2 only (the image has no Python 2)"
    if language is None:
        missing = missing or f"no {dmoj} in farm's judge image"
    if problem.problem_skip:  # first: the list of what farm lacks, whatever the language
        why = problem.problem_skip + (f"; and {missing}" if missing else "")
        return Skip(name, dmoj, why)
    if missing or language is None:
        return Skip(name, dmoj, missing or "")
    if name in SKIP_CASES:
        return Skip(name, dmoj, SKIP_CASES[name])
    if config.get("required_auxiliary_executors"):
        return Skip(name, dmoj, "needs another language's program beside it")
    if "score_cases" in config:
        return Skip(name, dmoj, "expects each test's partial points")
    try:
        checker, special = problem.checker() if not problem.judging else ("", None)
    except ValueError as error:
        return Skip(name, dmoj, str(error))
    tests, batches, depends = problem.tests()
    memory_mb = math.ceil(config["memory"] / 1024)
    if memory_mb < MIN_MEMORY_MB:
        notes.append(f"memory {config['memory']} KB raised to {MIN_MEMORY_MB} MB")
    limits = {
        "time_s": float(config["time"]),
        "memory_mb": max(memory_mb, MIN_MEMORY_MB),
        "compile_time_s": COMPILE_TIME_S,
        "output_mb": OUTPUT_MB,
    }
    item: dict[str, Any] = {
        "id": name,
        "language": language,
        "source": source,
        "tests": tests,
        "limits": limits,
        "all_tests": True,  # DMOJ runs every test (but a batch's after its first failure)
    }
    item |= problem.judging or {"checker": checker}
    if special is not None:
        item["special_judge"] = special
    cases = config.get("cases", {})
    per_test = {
        int(k): _verdicts(v)
        for k, v in (enumerate(cases, 1) if isinstance(cases, list) else cases.items())
    }
    expect = _verdicts(config.get("expect", "AC"))
    score = float(config["score"]) if "score" in config else None
    notes += problem.notes
    points = problem.points()
    return Case(name, dmoj, item, expect, per_test, batches, depends, notes, score, points)


def read_suite(root: Path, languages: set[str], py2_as_py3: bool) -> list[Case | Skip]:
    """Every case of the testsuite at ``root``, sorted by name."""
    found: list[Case | Skip] = []
    image = {
        dmoj: lang for dmoj, row in LANGUAGES.items() for lang in row[::-1] if lang in languages
    }
    for problem_dir in sorted(p for p in root.iterdir() if (p / "init.yml").is_file()):
        if not (problem_dir / "tests").is_dir():
            continue
        problem = Problem(problem_dir, image)
        for case_dir in sorted(p for p in (problem_dir / "tests").iterdir() if p.is_dir()):
            try:
                case = read_case(problem, case_dir, languages, py2_as_py3)
            except (KeyError, OSError, ValueError, UnicodeDecodeError) as error:
                case = Skip(f"{problem.name}/{case_dir.name}", "?", f"unreadable: {error!r}")
            if case is not None:
                found.append(case)
    return found
