"""The ``farm`` command: parse, call the API, render. No logic the API lacks."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from farm.cli.image_commands import image_app
from farm.cli.judge_commands import judge
from farm.cli.serve_commands import mcp, serve, token_app
from farm.client import Farm
from farm.errors import BrokerUnavailable, FarmError, LocalFarmError
from farm.models import ExecResult, Preloaded
from farm.settings import FarmSettings

app = typer.Typer(
    help="farm: a distributed, sandboxed Python execution farm.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(image_app, name="image")
app.add_typer(token_app, name="token")
app.command()(serve)
app.command()(mcp)
app.command()(judge)
console = Console()
err = Console(stderr=True)


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


@app.command()
def up(
    workers: int = typer.Option(2, help="worker processes (one sandbox each)"),
    backend: str = typer.Option("docker", help="docker | process (unisolated) | auto"),
) -> None:
    """Start a local farm in the background and record it (FARM_STATE_FILE)."""
    from farm.local.farm_up import start_background

    settings = FarmSettings()
    try:
        state = start_background(workers, backend, settings.state_file)
    except LocalFarmError as exc:
        _fail(str(exc))
    from kombu.utils.url import maybe_sanitize_url

    url = maybe_sanitize_url(str(state["broker_url"]))  # never print the broker's password
    console.print(f"farm up: {workers} workers, broker {url} (recorded in {settings.state_file})")


@app.command()
def down() -> None:
    """Stop the local farm `farm up` started, and remove what it made."""
    from farm.local.farm_up import stop_background

    if stop_background(FarmSettings().state_file):
        console.print("farm down: stopped")
    else:
        console.print("farm down: no local farm was up")


@app.command()
def status(as_json: bool = typer.Option(False, "--json")) -> None:
    """Workers, sandboxes, sessions and queue depth."""
    with _farm() as farm:
        workers = farm.workers()
        queues = farm.queue_depths()
        sessions = farm.registry.sessions()
    if as_json:
        print(json.dumps({"workers": workers, "queues": queues, "sessions": len(sessions)}))
        return
    rows = [_status_row(w) for w in workers]
    shown = _fitting_columns(rows, console.width)
    table = Table(title=f"farm: {len(workers)} workers, {len(sessions)} sessions")
    for column in shown:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(row[c] for c in shown))
    console.print(table)
    left_out = [c for c in STATUS_COLUMNS if c not in shown]
    if left_out:
        console.print(f"not shown at {console.width} columns: {', '.join(left_out)} (see --json)")
    bindings = sorted({str((w.get("kernel") or {}).get("binding")) for w in workers})
    console.print(
        f"boxes: in use/all a sandbox holds (set by its {', '.join(bindings) or '?'}); "
        "waiting: opens/map items at the worker"
    )
    console.print("queues: " + (", ".join(f"{q}={n}" for q, n in queues.items()) or "none"))
    if any(n for q, n in queues.items() if q.endswith(".chunks")):
        console.print("(a *.chunks list holds map chunks waiting for a worker with room)")


# `farm status`'s columns in the order shown; STATUS_WANTED ranks them: a terminal too narrow
# for all of them gets the most wanted ones that fit whole, never every one cut to `loc…`.
STATUS_COLUMNS = (
    "worker",
    "image",
    "gen",
    "ready",
    "boxes",
    "waiting",
    "sessions",
    "restarts",
    "backend",
    "image digest",
    "preload",
    "metrics",
)
STATUS_WANTED = (
    "worker",
    "ready",
    "boxes",
    "waiting",
    "sessions",
    "image",
    "restarts",
    "gen",
    "backend",
    "preload",
    "metrics",
    "image digest",
)


def _status_row(w: dict[str, Any]) -> dict[str, str]:
    sandbox = w.get("sandbox") or {}
    room = w.get("room") or {}
    waiting = room.get("waiting") or {}
    full = room.get("free") == 0 and room.get("boxes")
    return {
        "worker": str(w["id"]),
        "image": str(w.get("image")),
        "gen": str(w.get("generation")),
        "ready": "yes" if w.get("ready") else "[red]no[/]",
        # boxes in use of all it holds (yellow: none free); opens and map items waiting for one
        "boxes": f"{'[yellow]' if full else ''}{room.get('in_use')}/{w.get('capacity')}"
        f"{'[/]' if full else ''}",
        "waiting": f"{waiting.get('open', 0)}/{waiting.get('item', 0)}",
        "sessions": f"{w.get('sessions')}/{room.get('max_sessions', '?')}",
        "restarts": str(w.get("restarts")),
        "backend": str(sandbox.get("backend")),
        "image digest": str(sandbox.get("image_digest"))[:19],
        "preload": _preload_cell(sandbox.get("preload")),
        "metrics": str(w.get("metrics")),
    }


def _preload_cell(record: dict[str, Any] | None) -> str:
    """``numpy pandas !torch``: what the kernel preloaded, ``!`` (red) for what failed to;
    ``-`` for nothing, ``?`` before its sandbox has answered."""
    if record is None:
        return "?"
    preloaded = Preloaded.model_validate(record)
    failed = [f"[red]!{escape(name)}[/]" for name in preloaded.failed]
    return " ".join([*map(escape, preloaded.modules), *failed]) or "-"


def _fitting_columns(rows: list[dict[str, str]], width: int) -> list[str]:
    """The columns, in ``STATUS_COLUMNS``' order, that fit in ``width`` whole: the most wanted
    first, each as wide as its header or widest cell plus its padding and border."""
    from rich.text import Text

    used = 1  # the table's left border
    chosen: set[str] = set()
    for column in STATUS_WANTED:
        cells = [Text.from_markup(row[column]).cell_len for row in rows]
        need = max([len(column), *cells]) + 3  # a space either side and the right border
        if used + need <= width or not chosen:
            chosen.add(column)
            used += need
    return [c for c in STATUS_COLUMNS if c in chosen]


@app.command()
def run(
    file: Annotated[str, typer.Argument(help="a Python file, or - for stdin")] = "-",
    session: str | None = typer.Option(None, help="run in this existing session"),
    timeout: float = typer.Option(30.0, help="seconds"),
    image: str = typer.Option("default"),
    as_json: bool = typer.Option(False, "--json", help="print the ExecResult as JSON"),
) -> None:
    """Run code (one-shot, or in --session) and print the result."""
    code = sys.stdin.read() if file == "-" else Path(file).read_text()
    with _farm() as farm:
        try:
            if session:
                result = farm.attach(session, timeout_s=timeout).run(code)
            else:
                result = farm.run(code, image=image, timeout_s=timeout)
        except FarmError as exc:
            _fail(str(exc))
    if as_json:
        print(result.model_dump_json())
    else:
        _render(result)
    raise typer.Exit(0 if result.ok else 1)


def _render(result: ExecResult) -> None:
    if result.stdout:
        console.print(result.stdout, end="", markup=False, highlight=False)
    if result.stderr:
        err.print(result.stderr, end="", markup=False, highlight=False, style="yellow")
    if result.value is not None:
        console.print(result.value.text, markup=False)
    if result.error is not None:
        err.print(
            "".join(result.error.traceback) or f"{result.error.ename}: {result.error.evalue}",
            markup=False,
            highlight=False,
            style="red",
        )
        err.print(f"[bold red]{result.error.kind.value}[/]: {result.error.ename}")


@app.command()
def sweep(
    input_path: Annotated[Path, typer.Argument(help="JSONL: {id, code} or {id, cells}")],
    output: Path = typer.Option(..., "-o", "--output", help="JSONL results"),
    concurrency: int | None = typer.Option(
        None, help="items in flight (default: the capacity of the image's workers)"
    ),
    timeout: float = typer.Option(30.0, help="seconds per cell (an item may override)"),
    resume: bool = typer.Option(False, help="skip ids already in the output"),
    retries: int = typer.Option(2, help="retries of infrastructure failures"),
    image: str = typer.Option("default"),
    cache: Path | None = typer.Option(None, help="reuse results keyed by code+image+limits"),
    local: int = typer.Option(0, help="run an embedded farm with this many workers"),
    backend: str = typer.Option("docker", help="backend of the embedded farm"),
    journal: bool = typer.Option(False, help="add each item's session journal to its line"),
) -> None:
    """Run a JSONL sweep through the farm; resumable; prints a summary."""
    from farm.sweep import Sweep, SweepRecord, plan_sweep

    try:
        plan = plan_sweep(input_path, output, resume=resume)
    except (OSError, ValueError) as exc:
        _fail(str(exc), 2)

    with _farm(Farm.local(local, backend=backend) if local else None) as farm:
        progress = Progress(
            TextColumn("[bold]sweep"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TextColumn("{task.fields[rate]:.1f}/s"),
            TimeRemainingColumn(),
            console=err,
        )
        task = progress.add_task("sweep", total=None, failed=0, rate=0.0)
        counts = {"done": 0, "failed": 0}

        def on_record(record: SweepRecord) -> None:
            counts["done"] += 1
            counts["failed"] += record.status != "ok"
            elapsed = progress.tasks[0].elapsed or 1e-9
            progress.update(task, advance=1, failed=counts["failed"], rate=counts["done"] / elapsed)

        runner = Sweep(
            farm,
            concurrency=concurrency,
            timeout_s=timeout,
            retries=retries,
            image=image,
            cache_dir=cache,
            journal=journal,
            on_record=on_record,
            on_start=lambda total: progress.update(task, total=total),
        )
        with progress:
            summary = runner.run(plan, output)
    table = Table(
        title=f"sweep: {summary.total} items, {summary.skipped} skipped (resume), "
        f"{summary.duration_s:.1f}s" + (" — INTERRUPTED" if summary.interrupted else "")
    )
    table.add_column("status")
    table.add_column("kind")
    table.add_column("count", justify="right")
    for outcome, count in sorted(summary.by_outcome.items()):
        status_, _, kind = outcome.partition("/")
        table.add_row(status_, kind, str(count))
    console.print(table)
    if summary.scored:  # judge items with groups (subtasks)
        console.print(
            f"score: {summary.score:g} / {summary.max_score:g} "
            f"({summary.scored} judge items with groups)"
        )
    console.print(f"results: {output}")
    if summary.stopped:
        err.print(f"[bold red]sweep stopped:[/] {summary.stopped}")
        raise typer.Exit(1)
    if summary.interrupted:
        raise typer.Exit(130)


@app.command()
def replay(
    session_id: Annotated[str, typer.Argument(help="the session whose journal to show")],
    fmt: str = typer.Option("markdown", "--format", help="markdown | json (lines) | html"),
    output: Path | None = typer.Option(None, "-o", "--output", help="write to this file"),
) -> None:
    """Print or export a session's transcript from its journal."""
    from farm.events.transcripts import to_html, to_json_lines, to_markdown

    if fmt not in ("markdown", "json", "html"):
        _fail(f"unknown format {fmt!r}: use markdown, json or html", 2)
    with _farm() as farm:
        events = list(farm.replay(session_id))
    if not events:
        _fail(f"no journal for session {session_id} (never ran, or expired)")
    if fmt == "json":
        text = "".join(line + "\n" for line in to_json_lines(events))
    elif fmt == "html":
        text = to_html(events, title=f"farm session {session_id}")
    else:
        text = to_markdown(events)
    if output is not None:
        output.write_text(text, encoding="utf-8")
        err.print(f"{len(events)} events written to {output}")
    else:
        sys.stdout.write(text)


@app.command()
def ui(
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8765, help="port"),
) -> None:
    """Serve the live transcript page: workers, sessions, a session's transcript as it runs."""
    try:
        from farm.ui import serve
    except ImportError as exc:
        _fail(f"farm ui needs starlette and uvicorn ({exc}): pip install 'farm[ui]'")
    with _farm() as farm:
        console.print(f"farm ui: http://{host}:{port}/ (Ctrl-C stops it)")
        serve(farm, host=host, port=port)


@app.command()
def worker(
    image: str | None = typer.Option(
        None,
        "--image",
        help="the image it serves: a farm image (default, docs, a built one) or any image "
        "reference with python3 >= 3.9 (FARM_IMAGE)",
    ),
) -> None:
    """Start one worker (configured by FARM_* variables) in the foreground."""
    import os

    from farm.worker.__main__ import main

    if image:
        os.environ["FARM_IMAGE"] = image  # read by FarmSettings like every FARM_* setting
    main([])


@app.command()
def gc() -> None:
    """Remove sandbox containers whose owner (worker) is gone, queues of dead worker
    generations, and the directories of local farms whose owner was killed."""
    from farm.local.embedded import stale_dirs
    from farm.sandbox.docker import remove_orphans

    live: set[str] | None = None
    dropped = 0
    try:
        with _farm() as farm:
            live = {str(w["id"]) for w in farm.workers()}
            dropped = farm.registry.drop_queues(farm.registry.dead_direct_queues())
    except Exception:
        live = None
    removed = remove_orphans(live_owners=live)
    console.print(
        f"gc: removed {len(removed)} containers" + (f": {', '.join(removed)}" if removed else "")
    )
    console.print(f"gc: dropped {dropped} queues of dead worker generations")
    dirs = stale_dirs()
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
    console.print(
        f"gc: removed {len(dirs)} directories of dead local farms"
        + (f": {', '.join(map(str, dirs))}" if dirs else "")
    )


@app.command()
def drain(worker_id: str = typer.Argument(..., help="the worker's id (`farm status`)")) -> None:
    """Move a worker's sessions to other workers of its image (same ids, variables kept)
    before it stops; it takes no new session. Kubernetes' preStop runs this."""
    with _farm() as farm:
        report = farm.drain(worker_id)
    console.print(
        f"drain {worker_id}: {len(report.moved)} moved, {len(report.failed)} not moved "
        f"({report.duration_s:.1f} s)"
    )
    for session_id, what in report.lost.items():
        console.print(f"  {session_id}: moved without {escape(what)}")
    for session_id, why in report.failed.items():
        console.print(f"  {session_id}: [red]not moved[/]: {escape(why)}")
    raise typer.Exit(1 if report.failed else 0)


@app.command()
def doctor() -> None:
    """Check Docker, Redis, the image and a kernel round trip; say what to fix. The broker is
    the one `farm run` uses: FARM_BROKER_URL, else the farm `farm up` recorded."""
    from farm.cli.diagnose import run_checks

    ok = True
    for check in run_checks(Farm.default_settings()):
        ok &= check.ok
        mark = "[yellow]WARN[/]" if check.warn else "[green]ok[/]" if check.ok else "[red]FAIL[/]"
        console.print(f"{mark}  {check.name}: {escape(check.detail)}", highlight=False)
        if (check.warn or not check.ok) and check.fix:
            console.print(f"      fix: {check.fix}")
    raise typer.Exit(0 if ok else 1)


@contextlib.contextmanager
def _farm(farm: Farm | None = None) -> Iterator[Farm]:
    """``farm`` (default: ``Farm.default()``), closed at the end; what its broker's clients
    raise comes out as a farm error (``BrokerAuthFailed``, ``BrokerUnavailable``)."""
    from farm.broker_errors import REFUSED

    with farm or Farm.default() as held:
        try:
            yield held
        except REFUSED as exc:
            raise held.broker.error(exc, sent=False) from exc


def main() -> None:
    """The console entry point: typed farm errors and an unreachable broker end in one line."""
    logging.basicConfig(level=logging.WARNING)
    try:
        app()
    except BrokerUnavailable as exc:
        err.print(
            f"[bold red]error:[/] {escape(str(exc))}; start a farm with `farm up`, set "
            "FARM_BROKER_URL, or use `farm sweep --local N`"
        )
        sys.exit(1)
    except FarmError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        sys.exit(1)


if __name__ == "__main__":
    main()
