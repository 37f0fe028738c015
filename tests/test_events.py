"""Event models on their own: Jupyter rendering, bounded renderings, the MIME stream and the
HTML transcript's safety (no farm needed)."""

from __future__ import annotations

import json

from IPython.core.formatters import DisplayFormatter

from farm.client.journal_replay import live_cells
from farm.events.run_events import RENDER_CHARS, Display, Error, ExecEnd, ExecStart, Result, Stream
from farm.events.transcripts import mime_stream, to_html, to_markdown
from farm.models import ExecError, Value

COMMON = {"exec_id": "e1", "session_id": "s1", "ts": 1.0}
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
    "rkJggg=="
)


def events() -> list:  # type: ignore[type-arg]
    return [
        ExecStart(**COMMON, seq=0, code="print('```')\nchart", epoch=1),
        Stream(**COMMON, seq=1, name="stdout", text="```\n"),
        Display(
            **COMMON, seq=2, value=Value(text="<C>", data={"text/plain": "<C>", "image/png": PNG})
        ),
        Result(
            **COMMON,
            seq=3,
            value=Value(
                text="t", data={"text/plain": "t", "text/html": "<script>alert(1)</script>"}
            ),
        ),
        Error(
            **COMMON,
            seq=4,
            error=ExecError(ename="ValueError", evalue="bad", traceback=["tb\n"], kind="user"),
        ),
        ExecEnd(**COMMON, seq=5, status="error", kind="user", epoch=1, duration_s=0.5),
    ]


def test_jupyter_shows_framework_events_as_markdown_and_outputs_as_their_own_bundle() -> None:
    formatter = DisplayFormatter()
    start, stream, display, result, error, end = events()
    for event in (start, stream, error, end):
        data, _ = formatter.format(event)
        assert data["text/markdown"] == event._repr_markdown_()
    data, _ = formatter.format(display)
    assert data["image/png"] == PNG
    data, _ = formatter.format(result)
    assert data["text/html"] == "<script>alert(1)</script>"
    # a fence inside the code or the output cannot close the block early
    assert start._repr_markdown_().count("````") == 2
    assert stream._repr_markdown_().startswith("````")


def test_renderings_are_bounded() -> None:
    huge = Stream(**COMMON, seq=0, name="stdout", text="x" * 10_000_000)
    assert len(huge._repr_markdown_()) < RENDER_CHARS + 200
    assert len(next(mime_stream([huge]))["data"]["text/plain"]) < RENDER_CHARS + 200


def test_the_mime_stream_is_json_and_parses_back() -> None:
    items = list(mime_stream(events()))
    assert json.loads(json.dumps(items)) == items
    assert [i["type"] for i in items] == [
        "exec_start",
        "stream",
        "display",
        "result",
        "error",
        "exec_end",
    ]
    assert items[2]["data"]["image/png"] == PNG and "value" not in items[2]
    dumped = [e.model_dump(mode="json") for e in events()]
    assert list(mime_stream(dumped)) == items  # dicts (journal JSON) are accepted too


def test_the_html_transcript_runs_no_code_from_the_sandbox() -> None:
    page = to_html(events())
    assert "<script>" not in page  # the code's HTML sits escaped in a sandboxed frame
    assert '<iframe sandbox="" srcdoc="&lt;script&gt;' in page
    assert "data:image/png;base64," in page
    markdown = Display(
        **COMMON,
        seq=0,
        value=Value(text="m", data={"text/plain": "m", "text/markdown": "<b>raw</b> **ok**"}),
    )
    fragment_page = to_html([markdown])
    assert "<b>raw</b>" not in fragment_page and "<strong>ok</strong>" in fragment_page
    assert "ValueError" in to_markdown(events())


def test_restore_replays_only_what_the_lost_namespace_held() -> None:
    def run(exec_id: str, code: str, status: str = "ok", lost: bool = False) -> list:  # type: ignore[type-arg]
        common = {**COMMON, "exec_id": exec_id}
        return [
            ExecStart(**common, seq=0, code=code, epoch=1),
            ExecEnd(**common, seq=1, status=status, epoch=1, state_lost=lost),
        ]

    journal = (
        run("a", "x = 1")
        + run("b", "boom", "error", lost=True)  # an earlier loss: 'a' is gone with it
        + run("c", "y = 2")
        + run("d", "1/0", "error")  # failed: not replayed
        + run("e", "z = 3")
        + run("f", "os._exit(1)", "error", lost=True)  # the loss being restored
        + run("g", "later")
    )
    assert [c.code for c in live_cells(journal, "f")] == ["y = 2", "z = 3"]
