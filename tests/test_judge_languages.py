"""The judge's language table without Docker: every language has its verdicts' submissions in
the judge's tests, Judge0's ids name one language each, the default image leaves out only the
opt-in rows, docs/judge.md's table is the one the table prints (it cannot drift), and a Kotlin
program runs the class of its ``main``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from farm.judge.languages import DEFAULT_LANGUAGES, LANGUAGES, OPT_IN, markdown
from farm.judge.toolchains import VERSIONS
from farm.kernel.judge.entries import find
from farm.sandbox.variants import VARIANTS, judge_variant
from tests.judge_problems import SUM

JUDGE_PAGE = Path(__file__).resolve().parent.parent / "docs" / "judge.md"
SECTION = re.compile(r"<!-- judge-languages -->\n(.*?)<!-- /judge-languages -->\n", re.S)


def test_every_language_has_a_submission_for_each_verdict_judges_agree_on() -> None:
    for name in LANGUAGES:
        assert {"AC", "WA", "TLE", "RE", "CE"} <= set(SUM.get(name, {})), name


def test_judge0_ids_name_one_language_each() -> None:
    ids = [row.judge0 for row in LANGUAGES.values() if row.judge0 is not None]
    assert len(ids) == len(set(ids))
    assert {LANGUAGES[name].judge0 for name in ("kotlin", "csharp", "haskell", "pascal")} == {
        78,
        51,
        61,
        67,
    }


def test_the_default_judge_image_has_all_but_the_opt_in_languages() -> None:
    assert set(VARIANTS["judge"].languages) == set(LANGUAGES) - OPT_IN == set(DEFAULT_LANGUAGES)
    assert set(judge_variant(["haskell", "c"]).languages) == {"haskell", "c"}  # opt-in by name


def test_the_judge_page_table_is_the_generated_one_with_a_version_for_each_language() -> None:
    assert set(VERSIONS) == set(LANGUAGES)
    found = SECTION.search(JUDGE_PAGE.read_text())
    assert found is not None, "docs/judge.md lacks the judge-languages section"
    assert found[1] == markdown(VERSIONS), "run: python -m farm.judge.languages --markdown"
    printed = subprocess.run(
        [sys.executable, "-m", "farm.judge.languages", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert printed.stdout == found[1]


KOTLIN_MAINS = {
    "fun main() { println(readLine()) }": "MainKt",
    "fun main(args: Array<String>) {\n}\n": "MainKt",
    "object Main {\n    @JvmStatic fun main(args: Array<String>) {}\n}\n": "Main",
    "class Solution {\n  companion object {\n    @JvmStatic\n"
    '    fun main(args: Array<String>) { val s = "}" }\n  }\n}\n': "Solution",
    "package codeforces\n\nprivate fun readLn() = readLine()!!\nfun main() {}\n": (
        "codeforces.MainKt"
    ),
    "data class P(val a: Int)\nobject Runner { @JvmStatic fun main(a: Array<String>) {} }\n": (
        "Runner"
    ),
    "// object Foo { fun main() }\n/* class Bar { fun main( */\nfun main() {}\n": "MainKt",
    "fun solve() {}\n": "MainKt",  # no main: the JVM says so, a runtime error
}


def test_a_kotlin_program_runs_the_class_of_its_main() -> None:
    for source, main in KOTLIN_MAINS.items():
        assert find("kotlin", source, "main.kt") == ("main.kt", main), source
