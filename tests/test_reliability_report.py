"""``scripts/reliability_report.py`` on a tiny junit report of its own: what docs/reliability.md
would say (the suite itself runs only under ``make reliability``)."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_reliability_chaos" name="test_sigterm_lets_calls_finish" time="4.5">
  <properties><property name="expected" value="calls finish"/>
  <property name="observed" value="they finished"/></properties></testcase>
<testcase classname="tests.test_cotenancy" name="test_no_signal_reaches_a_neighbour" time="0.3">
  <properties><property name="expected" value="PermissionError for every signal"/>
  <property name="observed" value="PermissionError | 25 attempts"/></properties></testcase>
<testcase classname="tests.test_cotenancy" name="test_nothing_outlives_its_box" time="0.4">
  <properties><property name="expected" value="nothing left"/>
  <property name="observed" value="a file left"/></properties>
  <failure message="AssertionError: a file left">trace</failure></testcase>
</testsuite></testsuites>
"""


def report_script() -> Any:
    """The script's functions (``render``, ``read_junit``), without running it."""
    return SimpleNamespace(**runpy.run_path(str(REPO / "scripts" / "reliability_report.py")))


def test_co_tenancy_cases_get_a_section_of_their_own(tmp_path: Path) -> None:
    script = report_script()
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    doc = script.render(script.read_junit(junit), 10.0, None, 0.0, "skipped", [])
    sections = doc.split("\n## ")
    titles = [section.splitlines()[0] for section in sections[1:]]
    assert titles == ["Summary", "Cases", "Co-tenancy", "Failures", "Soak (`bench/soak.py`)"]
    cases, cotenancy = sections[2], sections[3]
    assert (
        "| chaos | sigterm lets calls finish | calls finish | they finished | pass | 4.5 |" in cases
    )
    assert "co-tenancy" not in cases  # its rows are in its own section only
    rows = [line for line in cotenancy.splitlines() if line.startswith("| ")]
    assert rows == [
        "| case | expected | observed | result | s |",
        "| no signal reaches a neighbour | PermissionError for every signal | "
        "PermissionError \\| 25 attempts | pass | 0.3 |",
        "| nothing outlives its box | nothing left | a file left | **FAIL** | 0.4 |",
    ]
    assert "| co-tenancy | 2 | 1 | 1 |" in sections[1]  # the summary still counts them
    assert "- **co-tenancy / nothing outlives its box**: AssertionError: a file left" in doc


def test_a_report_without_co_tenancy_cases_says_so(tmp_path: Path) -> None:
    script = report_script()
    junit = tmp_path / "junit.xml"
    junit.write_text(
        JUNIT.split('<testcase classname="tests.test_cotenancy"')[0] + "</testsuite></testsuites>"
    )
    doc = script.render(script.read_junit(junit), 1.0, None, 0.0, "skipped", [])
    assert "## Co-tenancy" in doc and "Not run: the junit report has no co-tenancy case." in doc


def test_the_load_suite_is_an_area_of_its_own(tmp_path: Path) -> None:
    script = report_script()
    junit = tmp_path / "junit.xml"
    junit.write_text(
        JUNIT.split('<testcase classname="tests.test_cotenancy"')[0]
        + '<testcase classname="tests.test_reliability_load" '
        'name="test_at_4x_no_record_is_lost_or_duplicated" time="300.0"><properties>'
        '<property name="expected" value="at 4x no record lost or duplicated"/>'
        '<property name="observed" value="0 lost, 0 duplicated"/></properties></testcase>'
        "</testsuite></testsuites>"
    )
    doc = script.render(script.read_junit(junit), 1.0, None, 0.0, "skipped", [])
    assert "| load | 1 | 1 | 0 |" in doc
    assert (
        "| load | at 4x no record is lost or duplicated | at 4x no record lost or duplicated | "
        "0 lost, 0 duplicated | pass | 300.0 |"
    ) in doc
