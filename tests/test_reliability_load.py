"""Overload, the short version (``bench/load.py --quick``): ``make reliability``'s load area.

The suite runs once, in a process of its own (its local farm, ``farm serve`` and threads are
its own), at 1x, 2x and 4x the farm's capacity with a mixed workload at once, then the burst
of a map at concurrency 512 beside 120 sessions opening at once; each test is one of its goals
(``load_report.goals``), with what was expected and what was observed recorded for
``scripts/reliability_report.py``. ``make test`` skips it (``chaos``): it takes minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.test_reliability_adversarial import record

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.reliability,
    pytest.mark.chaos,
    pytest.mark.timeout(1800),
]

REPO = Path(__file__).resolve().parents[1]
RUN_S = 1500.0  # the quick suite takes 4-10 minutes on 2 cores


@pytest.fixture(scope="module")
def goals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The goals of one ``bench/load.py --quick`` run of this checkout."""
    figures = tmp_path_factory.mktemp("load") / "load.json"
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "load.py"), "--quick", "--json", str(figures)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},  # its workers import this checkout's farm too
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    assert done.returncode == 0 and figures.exists(), done.stderr[-4000:]
    found: dict[str, dict[str, Any]] = json.loads(figures.read_text())["goals"]
    return found


Recorder = Callable[[str, object], None]


def met(goals: dict[str, dict[str, Any]], key: str, record_property: Recorder) -> None:
    goal = goals[key]
    record(record_property, goal["expected"], goal["observed"])
    assert goal["ok"], f"{goal['expected']}: {goal['observed']}"


def test_at_4x_no_record_is_lost_or_duplicated(goals: Any, record_property: Recorder) -> None:
    met(goals, "records_4x", record_property)


def test_at_4x_no_result_is_a_farm_failure(goals: Any, record_property: Recorder) -> None:
    met(goals, "farm_failures_4x", record_property)


def test_at_4x_every_session_keeps_its_variables(goals: Any, record_property: Recorder) -> None:
    met(goals, "variables_4x", record_property)


def test_at_4x_every_part_ends_with_its_level(goals: Any, record_property: Recorder) -> None:
    met(goals, "ends_4x", record_property)


def test_goodput_at_4x_keeps_nine_tenths_of_1x(goals: Any, record_property: Recorder) -> None:
    met(goals, "goodput", record_property)


def test_an_agent_runs_p99_at_4x_is_at_most_twice_1x(goals: Any, record_property: Recorder) -> None:
    met(goals, "agent_run_p99", record_property)


def test_workers_and_redis_stay_flat(goals: Any, record_property: Recorder) -> None:
    met(goals, "rss_flat", record_property)


def test_a_map_at_512_beside_120_opening_sessions_is_all_right(
    goals: Any, record_property: Recorder
) -> None:
    met(goals, "burst", record_property)
