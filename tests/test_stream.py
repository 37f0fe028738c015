"""Live event streams, the MIME stream, the session journal with replay, and opt-in restore,
against a real farm (Redis, Celery workers, Docker sandboxes)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from farm.client import AsyncSession, Farm
from farm.errors import StateLost
from farm.events.run_events import Display, Error, ExecEnd, ExecStart, Result, Stream
from farm.events.transcripts import mime_stream, to_html, to_markdown

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RICH = """
import base64
class Chart:
    def _repr_png_(self):
        return base64.b64decode(
            'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=='
        )
    def __repr__(self):
        return '<Chart>'
class Table:
    def _repr_html_(self):
        return '<table><tr><td>cell</td></tr></table>'
"""


def test_output_reaches_the_client_before_the_code_ends(farm: Farm) -> None:
    with farm.session() as s:
        stream = s.stream("print('early', flush=True)\nimport time\ntime.sleep(5)\n'done'")
        t0 = time.monotonic()
        arrivals: list[tuple[float, Any]] = []
        for event in stream:
            arrivals.append((time.monotonic() - t0, event))
        kinds = [type(e) for _, e in arrivals]
        assert kinds == [ExecStart, Stream, Result, ExecEnd]
        first_output = next(t for t, e in arrivals if isinstance(e, Stream))
        assert first_output < 4.0, f"the print arrived only after {first_output:.1f}s"
        assert arrivals[-1][0] >= 5.0
        assert stream.result is not None and stream.result.stdout == "early\n"
        assert stream.result.value is not None and stream.result.value.text == "'done'"
        assert [e.seq for _, e in arrivals] == [0, 1, 2, 3]


def test_run_returns_the_same_result_as_before(farm: Farm) -> None:
    with farm.session() as s:
        result = s.run("print('hi')\ndisplay('shown')\n6 * 7")
        assert result.ok and result.stdout == "hi\n" and result.value is not None
        assert result.value.text == "42" and result.worker == s.worker
        failed = s.run("raise ValueError('bad')")
        assert failed.kind == "user" and failed.error is not None
        assert failed.error.ename == "ValueError"


def test_displays_and_errors_are_typed_events_with_their_own_bundles(farm: Farm) -> None:
    with farm.session() as s:
        s.run(RICH)
        events = list(s.stream("print('a')\ndisplay(Chart())\ndisplay(Table())\n1/0"))
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["ExecStart", "Stream", "Display", "Display", "Error", "ExecEnd"]
    chart, table = events[2], events[3]
    assert isinstance(chart, Display) and "image/png" in chart._repr_mimebundle_()
    assert isinstance(table, Display) and "<table>" in table.mime_bundle()["text/html"]
    error = events[4]
    assert isinstance(error, Error) and error.error.ename == "ZeroDivisionError"
    end = events[-1]
    assert isinstance(end, ExecEnd) and end.status == "error" and end.kind == "user"
    for event in events:
        assert isinstance(event._repr_markdown_(), str) and event._repr_markdown_()
    assert "ZeroDivisionError" in to_markdown(events)


def test_the_mime_stream_round_trips_through_json(farm: Farm) -> None:
    with farm.session() as s:
        s.run(RICH)
        items = list(mime_stream(s.stream("print('x')\ndisplay(Chart())\nTable()")))
    assert json.loads(json.dumps(items)) == items
    by_type = {item["type"]: item for item in items}
    assert by_type["display"]["data"]["image/png"].startswith("iVBOR")
    assert "<table>" in by_type["result"]["data"]["text/html"]
    assert by_type["stream"]["data"]["text/plain"] == "x\n"
    assert "```python" in by_type["exec_start"]["data"]["text/markdown"]
    page = to_html(items_to_events(items))
    assert "data:image/png;base64," in page and "<iframe sandbox" in page


def items_to_events(items: list[dict[str, Any]]) -> list[Any]:
    from farm.events.run_events import parse_event

    out = []
    for item in items:
        raw = dict(item)
        data = raw.pop("data")
        if raw["type"] in ("display", "result"):
            raw["value"] = {"text": data["text/plain"], "data": data}
        out.append(parse_event(raw))
    return out


def test_any_process_replays_a_sessions_journal(farm: Farm) -> None:
    with farm.session() as s:
        s.run("x = 20")
        live = list(s.stream("print('hello')\ndisplay(x)\nx + 1"))
        session_id = s.id
    other = Farm(farm.settings)
    try:
        replayed = list(other.replay(session_id))
    finally:
        other.close()
    assert [type(e) for e in replayed][:2] == [ExecStart, ExecEnd]  # the first cell: x = 20
    assert replayed[2:] == live  # the same events, in the same order
    import farm as farm_package

    assert farm_package.replay(session_id, farm.settings.broker_url) == replayed


def test_a_timeout_and_a_loss_end_the_stream_like_run(farm: Farm) -> None:
    with farm.session() as s:
        events = list(s.stream("import time\ntime.sleep(10)", timeout_s=1))
        end = events[-1]
        assert isinstance(end, ExecEnd) and end.kind == "timeout" and not end.state_lost
        stream = s.stream("import os\nos._exit(1)")
        with pytest.raises(StateLost):
            for _ in stream:
                pass


def test_async_stream_yields_the_same_events(farm: Farm) -> None:
    async def main() -> list[Any]:
        session = AsyncSession(await asyncio.to_thread(farm.session))
        try:
            return [e async for e in session.stream("print('async')\n3")]
        finally:
            await session.aclose()

    events = asyncio.run(main())
    assert [type(e) for e in events] == [ExecStart, Stream, Result, ExecEnd]


def test_replay_restore_reruns_the_successful_cells(farm: Farm) -> None:
    with farm.session(on_state_lost="replay") as s:
        s.run("x = 1")
        s.run("y = x + 1")
        s.run("undefined_name")  # failed: not replayed
        s.run("import pathlib\npathlib.Path('/tmp/ran').open('a').write('r')")
        lost = s.run("import os\nos._exit(1)")
        assert lost.state_lost and lost.kind == "state_lost"
        report = s.restores[-1]
        assert [c.code for c in report.replayed] == [
            "x = 1",
            "y = x + 1",
            "import pathlib\npathlib.Path('/tmp/ran').open('a').write('r')",
        ]
        assert "side effects" in report.warning and not report.reran_lost_call
        value = s.run("(x, y, open('/tmp/ran').read())").value
        assert value is not None and value.text == "(1, 2, 'rr')"  # the side effect repeated
        replays = [e for e in s.farm.replay(s.id) if isinstance(e, ExecStart) and e.replay_of]
        assert [e.replay_of for e in replays] == [c.exec_id for c in report.replayed]


def test_replay_restore_reruns_a_call_that_found_its_process_dead(
    farm: Farm, docker_env: Any
) -> None:
    with farm.session(on_state_lost="replay") as s:
        s.run("x = 41")
        pid = s.run("import os\nos.getpid()").value
        uid = s.run("os.getuid()").value
        assert pid is not None and uid is not None
        # killed between calls, by a command in its own box (as its uid), and gone (or a
        # zombie) before the next call, so that call finds the process dead
        probe = (
            "import os, signal, time\n"
            f"os.kill({pid.text}, signal.SIGKILL)\n"
            "deadline = time.monotonic() + 10\n"
            "while time.monotonic() < deadline:\n"
            "    try:\n"
            f"        if open('/proc/{pid.text}/stat').read().split(')')[1].split()[0] == 'Z':\n"
            "            break\n"
            "    except FileNotFoundError:\n"
            "        break\n"
            "    time.sleep(0.01)\n"
            "else:\n"
            "    raise SystemExit('still alive')\n"
        )
        killed = s.exec(["python3", "-c", probe])
        assert killed.returncode == 0, killed.stderr
        result = s.run("x + 1")
        assert s.restores and s.restores[-1].reran_lost_call
        replayed = [c.code for c in s.restores[-1].replayed]
        assert replayed == ["x = 41", "import os\nos.getpid()", "os.getuid()"]
        assert result.ok and result.value is not None and result.value.text == "42"


def test_the_default_still_raises_state_lost(farm: Farm) -> None:
    with farm.session() as s:
        s.run("x = 1")
        with pytest.raises(StateLost):
            s.run("import os\nos._exit(1)")
        assert s.restores == []


def test_farm_replay_prints_and_exports_a_transcript(farm: Farm, tmp_path: Path) -> None:
    with farm.session() as s:
        s.run("print('for the record')\ndisplay({'k': 1})\n6 * 7")
    env = {**os.environ, "FARM_BROKER_URL": farm.settings.broker_url}
    farm_cli = str(Path(sys.executable).parent / "farm")

    def replay(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [farm_cli, "replay", s.id, *args], env=env, capture_output=True, text=True, timeout=60
        )

    markdown = replay()
    assert markdown.returncode == 0, markdown.stderr
    assert "```python" in markdown.stdout and "for the record" in markdown.stdout
    assert "**Out:**" in markdown.stdout and "42" in markdown.stdout
    lines = replay("--format", "json").stdout.splitlines()
    items = [json.loads(line) for line in lines]
    assert [i["type"] for i in items] == ["exec_start", "stream", "display", "result", "exec_end"]
    page = tmp_path / "t.html"
    assert replay("--format", "html", "-o", str(page)).returncode == 0
    assert "for the record" in page.read_text() and "<script" not in page.read_text()
    missing = replay_missing(farm_cli, env)
    assert missing.returncode == 1 and "no journal" in missing.stderr


def replay_missing(farm_cli: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [farm_cli, "replay", "no-such-session"], env=env, capture_output=True, text=True
    )


def test_a_sweep_can_carry_each_items_journal(farm: Farm, tmp_path: Path) -> None:
    from farm.sweep import Sweep, plan_sweep

    source = tmp_path / "in.jsonl"
    source.write_text(
        json.dumps({"id": 1, "cells": ["a = 2", "print(a * 21)"]})
        + "\n"
        + json.dumps({"id": 2, "code": "1/0"})
        + "\n"
    )
    out = tmp_path / "out.jsonl"
    Sweep(farm, concurrency=2, journal=True).run(plan_sweep(source, out), out)
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    first = [i["type"] for i in records[1]["journal"]]
    assert first == ["exec_start", "exec_end", "exec_start", "stream", "exec_end"]
    assert records[1]["journal"][3]["data"]["text/plain"] == "42\n"
    assert [i["type"] for i in records[2]["journal"]][-2:] == ["error", "exec_end"]
    plain = tmp_path / "plain.jsonl"
    Sweep(farm, concurrency=2).run(plan_sweep(source, plain), plain)
    assert all("journal" not in json.loads(line) for line in plain.read_text().splitlines())


def test_outputs_past_a_runs_journal_budget_keep_only_their_text(farm: Farm) -> None:
    code = (
        "class Big:\n"
        "    def _repr_html_(self):\n"
        "        return '<p>' + 'x' * 2_000_000 + '</p>'\n"
        "    def __repr__(self):\n"
        "        return '<Big>'\n"
        "for _ in range(3):\n"
        "    display(Big())"
    )
    with farm.session() as s:
        live = [e for e in s.stream(code) if isinstance(e, Display)]
        journaled = [e for e in farm.replay(s.id) if isinstance(e, Display)]
    assert len(live) == len(journaled) == 3
    assert all("text/html" in e.value.data for e in live)  # the live stream gets them whole
    assert "text/html" in journaled[0].value.data
    assert journaled[-1].value.data == {"text/plain": "<Big>"}  # 2 MB per run by default
