"""The kernel's live half: a running cell's events reach the host before its result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from farm.kernel.supervisor.streaming import TICK_S
from farm.kernel.wire.client import KernelClient
from farm.models import ExecResult, Value
from tests.conftest import Cells
from tests.waiting import wait_for


def run_collect(
    client: KernelClient, cells: Cells, code: str, **kwargs: Any
) -> tuple[ExecResult, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    raw = client.execute(
        cells.id, code, epoch=cells.epoch, timeout_s=30, on_event=events.append, **kwargs
    )
    result = ExecResult.model_validate(raw)
    cells.epoch = result.epoch
    return result, events


def streamed(events: list[dict[str, Any]], name: str) -> str:
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == name)


def test_events_come_in_order_and_the_stream_equals_the_result(
    client: KernelClient, cells: Cells
) -> None:
    code = "print('a')\ndisplay(42)\nimport sys\nprint('oops', file=sys.stderr)\nprint('b')\n7"
    result, events = run_collect(client, cells, code)
    assert result.ok and result.value is not None and result.value.text == "7"
    assert events[0] == {"type": "started"}
    kinds = [e["type"] for e in events]
    display_at = kinds.index("display")
    assert streamed(events[:display_at], "stdout") == "a\n"  # printed before display() comes first
    Value.model_validate(events[display_at]["value"])
    assert events[display_at]["value"]["text"] == "42"
    assert streamed(events, "stdout") == result.stdout == "a\nb\n"
    assert streamed(events, "stderr") == result.stderr == "oops\n"


def test_output_reaches_the_host_while_the_cell_still_runs(
    client: KernelClient, cells: Cells
) -> None:
    seen: list[float] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "stream":
            seen.append(time.monotonic())

    t0 = time.monotonic()
    raw = client.execute(
        cells.id,
        "print('early')\nimport time\ntime.sleep(3)",
        epoch=cells.epoch,
        timeout_s=30,
        on_event=on_event,
    )
    ended = time.monotonic()
    assert raw["status"] == "ok" and ended - t0 >= 3
    assert seen and seen[0] - t0 < 2.0, "the print only arrived with the result"


def test_streamed_output_keeps_the_caps_and_matches_the_cut_result(
    client: KernelClient, cells: Cells
) -> None:
    code = "for i in range(20000):\n    print(f'line {i}')"
    result, events = run_collect(client, cells, code, max_output_bytes=4096)
    assert result.stdout_truncated
    assert streamed(events, "stdout") == result.stdout
    assert len(result.stdout) < 5000 and "farm cut" in result.stdout
    chunks = [e for e in events if e["type"] == "stream"]
    assert len(chunks) < 50  # batched, not one event per print


def test_a_character_split_between_chunks_and_a_torn_end_stream_as_the_result_says(
    client: KernelClient, cells: Cells
) -> None:
    code = (
        "import os, time\n"
        "os.write(1, 'é'.encode()[:1])\n"  # half a character, flushed on its own
        "time.sleep(0.2)\n"
        "os.write(1, 'é'.encode()[1:] + b'ok' + 'é'.encode()[:1])"  # ends torn
    )
    result, events = run_collect(client, cells, code)
    assert result.stdout == "éok\ufffd"
    assert streamed(events, "stdout") == result.stdout
    quiet, quiet_events = run_collect(client, cells, "x = 1")  # silent: no stream at all
    assert quiet.stdout == "" and not any(e["type"] == "stream" for e in quiet_events)


def test_many_small_prints_are_batched(client: KernelClient, cells: Cells) -> None:
    result, events = run_collect(client, cells, "for i in range(3000):\n    print(i)")
    assert streamed(events, "stdout") == result.stdout
    assert 1 <= sum(e["type"] == "stream" for e in events) < 100


def test_display_shows_rich_bundles_and_is_bounded(client: KernelClient, cells: Cells) -> None:
    code = (
        "class Rich:\n"
        "    def _repr_html_(self): return '<b>bold</b>'\n"
        "    def _repr_markdown_(self): return '**bold**'\n"
        "display(Rich(), 'two')\n"
        "for i in range(300):\n"
        "    display(i)\n"
    )
    result, events = run_collect(client, cells, code)
    assert result.ok, result.error
    displays = [e["value"] for e in events if e["type"] == "display"]
    assert displays[0]["data"]["text/html"] == "<b>bold</b>"
    assert displays[0]["text"] == "**bold**"
    assert displays[1]["text"] == "'two'"
    assert len(displays) == 200  # MAX_DISPLAYS, then one notice
    assert "display() limit" in streamed(events, "stderr")


def test_without_events_display_costs_nothing_and_the_protocol_stays_sound(
    client: KernelClient, cells: Cells, tmp_path: Path
) -> None:
    assert cells.value("display('x')\n1") == "1"
    # a thread that displays after its cell ended must not leave a frame for the next cell
    fired = tmp_path / "fired"
    cells.run(
        "import threading\n"
        "def late():\n"
        "    display('late')\n"
        f"    open({str(fired)!r}, 'w').close()\n"
        "threading.Timer(0.2, late).start()"
    )
    assert wait_for(fired.exists, 10), "the timer never displayed"
    assert cells.value("2 + 2") == "4"
    result, events = run_collect(client, cells, "print('next')")
    assert streamed(events, "stdout") == "next\n"


def test_a_killed_cell_streams_what_it_printed(own_cells: Cells) -> None:
    events: list[dict[str, Any]] = []
    raw = own_cells.client.execute(
        own_cells.id,
        "print('before', flush=True)\nimport os\nos._exit(3)",
        epoch=own_cells.epoch,
        timeout_s=30,
        on_event=events.append,
    )
    result = ExecResult.model_validate(raw)
    assert result.state_lost and result.stdout == "before\n"
    assert streamed(events, "stdout") == "before\n"


def test_only_a_cell_that_keeps_running_says_so(client: KernelClient, cells: Cells) -> None:
    t0 = time.monotonic()
    _, quick = run_collect(client, cells, "1")
    took = time.monotonic() - t0
    # a loaded machine may take longer than the tick even for "1": then it may say so
    assert [e["type"] for e in quick] == ["started"] or took >= TICK_S
    _, slow = run_collect(client, cells, "import time\ntime.sleep(0.5)")
    assert [e["type"] for e in slow] == ["started", "running"]


def test_a_session_dying_just_before_a_call_is_reported_not_a_broken_connection(
    kernel: Any,
) -> None:
    with kernel.kernel() as client:
        for _ in range(5):
            session = client.open_session()
            sid, epoch = session["session_id"], session["epoch"]
            client.execute(
                sid,
                "import os, threading\nthreading.Timer(0.1, os._exit, (1,)).start()",
                epoch=epoch,
                timeout_s=10,
            )

            def lost(sid: str = sid, epoch: int = epoch) -> dict[str, Any] | None:
                raw = client.execute(sid, "1", epoch=epoch, timeout_s=10, on_event=lambda e: None)
                return raw if raw["state_lost"] else None

            # calls close together (2 ms apart), so one may meet the dying process
            raw = wait_for(lost, 10, 0.002)
            assert raw is not None, "the session never died"
            assert raw["error"]["kind"] == "state_lost"
            client.close_session(sid)


def test_a_quick_silent_cell_says_started_in_its_reply_not_in_a_frame_of_its_own(
    client: KernelClient, cells: Cells
) -> None:
    frames: list[dict[str, Any]] = []

    def collect(frame: dict[str, Any]) -> None:
        frames.append(frame)

    message: Any = {
        "type": "execute",
        "session_id": cells.id,
        "epoch": cells.epoch,
        "code": "1",
        "timeout_s": 30.0,
        "exec_id": "quick-silent",
        "events": True,
    }
    t0 = time.monotonic()
    reply = client.request(message, 30.0, collect)
    took = time.monotonic() - t0
    assert reply["result"]["status"] == "ok"
    kinds = [f["event"]["type"] for f in frames]
    if not frames:  # the common case: one frame, the reply, which says the cell started
        assert reply["started"] is True
    else:  # a loaded machine took past the tick: then started goes out before running
        assert took >= TICK_S and kinds == ["started", "running"] and "started" not in reply
    # a cell that prints has its started event sent ahead of its output, as a frame
    frames.clear()
    printed = client.request({**message, "code": "print('hi')", "exec_id": "print"}, 30.0, collect)
    assert [f["event"]["type"] for f in frames][:2] == ["started", "stream"]
    assert "started" not in printed
    # a cell the kernel refuses to run (a gone epoch) never says it started
    refused = client.request({**message, "epoch": cells.epoch + 5, "exec_id": "gone"}, 30.0)
    assert refused["result"]["state_lost"] and "started" not in refused
