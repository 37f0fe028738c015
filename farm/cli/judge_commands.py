"""``farm judge --problem DIR SOURCE``: one submission judged on a problem package (Kattis or
Polygon) on the connected farm (or an embedded one, ``--local N``), shown as a verdict table;
the exit status is 0 for AC only, as ``verifyproblem`` judges a submission. Thin, like the
rest of the CLI: ``Farm.judge`` does the work."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from farm.cli.serve_commands import BROKER, fail, farm_for
from farm.client import Farm
from farm.errors import FarmError
from farm.judge import JUDGE_IMAGE
from farm.judge.packages import language_of, open_package
from farm.models.judge import JudgeResult, Verdict

console = Console()
STYLES = {Verdict.AC: "green", Verdict.IE: "bold red"}


def judge(
    source: Annotated[Path, typer.Argument(help="the submission's source file")],
    problem: Path = typer.Option(..., "--problem", help="the problem package's directory"),
    language: str | None = typer.Option(
        None, "--language", "-l", help="a judge language (default: from SOURCE's extension)"
    ),
    image: str = typer.Option(JUDGE_IMAGE, help="the judge image"),
    local: int = typer.Option(0, "--local", help="run an embedded farm of this many judges"),
    broker_url: str | None = BROKER,
    as_json: bool = typer.Option(False, "--json", help="the JudgeResult as JSON"),
) -> None:
    """Judge SOURCE on a problem package; exit 0 if accepted (AC), else 1."""
    language = language or language_of(source.name)
    if language is None:
        fail(f"no judge language has the extension of {source.name}: give --language", 2)
    try:
        text = source.read_text()
        package = open_package(problem)
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{source}: {exc}", 2)
    except FarmError as exc:
        fail(str(exc), 2)
    held: AbstractContextManager[Farm] = (
        Farm.local(images={image: local}) if local else farm_for(0, broker_url)
    )
    with held as farm:
        result = farm.judge(language, text, problem=package.problem, image=image)
    if as_json:
        print(result.model_dump_json(exclude_none=True))
    else:
        show(result, f"{source.name} on {problem.name} ({language})", package.names)
    raise typer.Exit(0 if result.verdict == Verdict.AC else 1)


def show(result: JudgeResult, title: str, names: list[str] | None = None) -> None:
    """The verdict of each test (named by its file, when ``names``), its groups' scores,
    then the verdict."""
    table = Table(title=title)
    for column in ("test", "verdict", "time", "memory", "message"):
        table.add_column(column, justify="right" if column in ("time", "memory") else "left")
    for test in result.tests:
        table.add_row(
            names[test.index] if names else str(test.index + 1),
            f"[{STYLES.get(test.verdict, 'red')}]{test.verdict.value}[/]",
            f"{test.time_s:.3f}s",
            f"{test.memory_kb / 1024:.1f}MB",
            test.message.strip()[:80],
        )
    console.print(table)
    if result.groups:
        groups = Table(title="groups")
        for column in ("group", "verdict", "score", "note"):
            groups.add_column(column)
        for group in result.groups:
            note = f"blocked by {group.blocked_by}" if group.blocked_by else ""
            groups.add_row(
                group.name, group.verdict.value, f"{group.scored:g} / {group.points:g}", note
            )
        console.print(groups)
        console.print(f"score: {result.score:g} / {result.max_score:g}")
    if result.compile is not None and result.compile.status == "error":
        console.print(result.compile.output.strip()[-2000:], markup=False, highlight=False)
    style = STYLES.get(result.verdict, "red")
    message = f": {result.message.strip()[:200]}" if result.message.strip() else ""
    console.print(f"verdict: [{style}]{result.verdict.value}[/]{message}", highlight=False)
