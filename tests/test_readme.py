"""The README stays a first screen: it opens with the two-command quick start, shows a short
Python example near the top, and that example, run against a real local farm, prints what its
comments say; the summary it shows for `make run` is the one the example sweep gives. Everything
longer lives in docs/ (tests/test_docs_links.py keeps the links)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from farm.sweep import Sweep, plan_sweep

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300


def python_example() -> tuple[int, str]:
    """The README's first Python block: the line it starts on and its code."""
    text = README.read_text()
    found = re.search(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    assert found is not None, "README.md has no Python example"
    return text[: found.start()].count("\n") + 1, found[1]


def test_the_readme_opens_with_the_quick_start_and_stays_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, "move the detail to a page of docs/ and link it"
    first = next(i for i, line in enumerate(lines) if line.startswith("## "))
    assert lines[first] == "## Quick start"
    quick = "\n".join(lines[first : first + 12])
    assert "make run" in quick and "make test" in quick


def test_the_python_example_is_short_and_on_the_first_screen() -> None:
    start, code = python_example()
    assert start <= 60
    assert len(code.splitlines()) <= 10


def test_the_readmes_python_example_prints_what_its_comments_say(
    docker_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, code = python_example()
    exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    printed = capsys.readouterr().out.splitlines()
    squares = [f"{i} ok {i * i}" for i in range(5)]
    assert printed == ["12.566370614359172", "user", *squares]


@pytest.mark.slow
def test_the_make_run_table_is_what_the_example_sweep_gives(farm: Any, tmp_path: Path) -> None:
    """`make run` is ``farm sweep examples/sweep.jsonl --local 2``: the same sweep, its counts."""
    rows = re.findall(r"^│ (\w+) +│ ([\w-]+) +│ +(\d+) │$", README.read_text(), flags=re.M)
    shown = {f"{status}/{kind}": int(count) for status, kind, count in rows}
    assert sum(shown.values()) == 40, "README.md lacks the make run table"
    out = tmp_path / "results.jsonl"
    summary = Sweep(farm).run(plan_sweep(ROOT / "examples" / "sweep.jsonl", out), out)
    assert summary.by_outcome == shown
