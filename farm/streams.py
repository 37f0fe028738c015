"""Event streams for people and programs: the live stream of a run, the portable MIME stream,
and transcripts (markdown, HTML) of any stream, live or replayed.

``EventStream`` follows one run: the worker writes its events to a Redis stream as the kernel
sends them and this reads them with ``XREAD BLOCK`` in short slices, checking the owning worker
and the broker between slices like ``Session.run`` does, within the same deadline. The run's
``ExecResult`` still comes back through its task, so ``stream.result`` is exactly what
``run`` returns; events the worker could not publish are rebuilt from it.
"""

from __future__ import annotations

import contextlib
import html
import json
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from farm.broker import BROKER_DOWN, release
from farm.errors import BrokerUnavailable
from farm.events import Event, ExecEnd, ExecStart, HostCall, closing_events, parse_event
from farm.models import CallAnswer, ExecResult

if TYPE_CHECKING:
    from farm.session import Session

BLOCK_MS = 250


class EventStream:
    """``for event in session.stream(code)``; afterwards ``.result`` holds the ``ExecResult``.

    Iterating sends the code (once). Events arrive in order while the code runs; the stream
    ends after ``ExecEnd``. Losses surface as ``run`` raises them (``SessionLost``,
    ``StateLost``), after the events that tell them.
    """

    def __init__(self, session: Session, code: str, timeout_s: float | None, **kwargs: Any):
        self.session = session
        self.code = code
        self.timeout_s = timeout_s
        self.kwargs = kwargs
        self.result: ExecResult | None = None
        self._iter: Iterator[Event] | None = None

    def __iter__(self) -> Iterator[Event]:
        if self._iter is None:
            self._iter = self._events()
        return self._iter

    def __next__(self) -> Event:
        return next(iter(self))

    def _events(self) -> Iterator[Event]:
        session, farm = self.session, self.session.farm
        call = session._send(self.code, self.timeout_s, stream=True, **self.kwargs)
        exec_id = call.request["exec_id"]
        seen_start, seen_end, done, seq, after, calls = False, False, False, 0, "0", 0
        end = call.deadline

        def read(after: str, block_ms: int) -> tuple[str, list[Event]]:
            fetch = lambda: farm.journal.read_exec(exec_id, after, block_ms)  # noqa: E731
            return farm.broker.call(fetch, sent=True, deadline=end)

        try:
            while not (seen_end or done):
                after, events = read(after, BLOCK_MS)
                if not events and farm.broker.call(call.pending.ready, sent=True, deadline=end):
                    after, events = read(after, 1)
                    done = True  # the task is over: whatever was published is there
                for event in events:
                    seen_start |= isinstance(event, ExecStart)
                    seen_end |= isinstance(event, ExecEnd)
                    seq = event.seq + 1
                    if isinstance(event, HostCall):  # the cell waits: answer before yielding
                        answer = self._answer(event, calls)
                        farm.broker.call(
                            lambda: farm.journal.push_answer(exec_id, event.call_id, answer),  # noqa: B023
                            sent=True,
                            deadline=end,
                        )
                        calls += event.items
                    yield event
                if not (seen_end or done):
                    farm.broker.check(call.pending, call.deadline, call.watch)
        except BrokerUnavailable:  # not waited for any more: let go without the broker
            release(call.pending, unsubscribe=False)
            raise
        except BaseException:
            release(call.pending)
            raise
        finally:
            with contextlib.suppress(*BROKER_DOWN):  # it expires by itself
                farm.journal.drop_exec(exec_id)
        result = session._collect(call)
        if not seen_end:
            yield from self._rebuilt(result, seen_start, seq)
        self.result = session._settle(result, self.code, self.timeout_s, **self.kwargs)

    def _answer(self, event: HostCall, made: int) -> CallAnswer:
        callbacks = self.session.callbacks
        if callbacks is None:
            return CallAnswer(
                ok=False, error={"ename": "CallbackError", "evalue": "no callbacks registered"}
            )
        return callbacks.answer(event, made)

    def _rebuilt(self, result: ExecResult, seen_start: bool, seq: int) -> Iterator[Event]:
        """The events the worker could not publish, from the result (a Redis hiccup)."""
        exec_id, session_id, now = result.exec_id, self.session.id, time.time()
        if not seen_start:
            yield ExecStart(
                exec_id=exec_id,
                session_id=session_id,
                ts=now,
                seq=seq,
                code=self.code,
                epoch=self.session.epoch,
            )
            seq += 1
        yield from closing_events(
            result.model_dump(mode="json"),
            exec_id=exec_id,
            session_id=session_id,
            seq=seq,
            ts=now,
            ran=True,
        )


# --- portable MIME stream ---------------------------------------------------------------------


def mime_stream(events: Iterable[Event | dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """JSON-serialisable dicts, one per event: its fields plus ``data``, a MIME bundle.

    ``data`` is the displayed object's own bundle for ``display`` and ``result`` events
    (``text/plain`` always; ``text/markdown``, ``text/html``, ``image/png`` as base64,
    ``application/json`` when the object offers them) and the event's bounded ``text/plain`` and
    ``text/markdown`` renderings for the others. Dicts (e.g. journal JSON) are parsed first.
    """
    for item in events:
        event = parse_event(item) if isinstance(item, dict) else item
        out = event.model_dump(mode="json")
        out.pop("value", None)
        out["data"] = event.mime_bundle()
        yield out


# --- transcripts -----------------------------------------------------------------------------


def to_markdown(events: Iterable[Event]) -> str:
    return "\n\n".join(event._repr_markdown_() for event in events) + "\n"


def _markdown_html(text: str) -> str:
    from markdown_it import MarkdownIt

    # Raw HTML in markdown is not rendered (it may come from sandboxed code); links with
    # unsafe schemes are refused by markdown-it's own link validation.
    rendered: str = MarkdownIt("commonmark", {"html": False}).render(text)
    return rendered


def fragment(item: dict[str, Any]) -> str:
    """Safe HTML for one ``mime_stream`` dict: PNG as an image, HTML in a sandboxed frame
    (no scripts, no same-origin access), markdown rendered without raw HTML, text escaped."""
    data = item.get("data") or {}
    kind = html.escape(str(item.get("type", "")))
    if isinstance(data.get("image/png"), str):
        body = f'<img alt="output" src="data:image/png;base64,{html.escape(data["image/png"])}">'
    elif isinstance(data.get("text/html"), str):
        body = f'<iframe sandbox="" srcdoc="{html.escape(data["text/html"])}"></iframe>'
    elif isinstance(data.get("text/markdown"), str):
        body = _markdown_html(data["text/markdown"])
    else:
        body = f"<pre>{html.escape(str(data.get('text/plain', '')))}</pre>"
    return f'<div class="event {kind}">{body}</div>'


PAGE_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 1rem auto; }
.event { margin: .3rem 0; } pre { background: #f6f8fa; padding: .5rem; overflow-x: auto; }
.stream pre { background: #fff; border-left: 3px solid #ccc; margin: 0; }
.error pre { background: #fff0f0; } iframe { border: 1px solid #ddd; width: 100%; }
img { max-width: 100%; } .exec_end { color: #666; font-size: .9em; }
"""


def to_html(events: Iterable[Event], title: str = "farm transcript") -> str:
    """A standalone HTML page of a transcript (no scripts, nothing loaded from elsewhere)."""
    body = "\n".join(fragment(item) for item in mime_stream(events))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{PAGE_STYLE}</style></head><body><h1>{html.escape(title)}</h1>\n{body}\n"
        "</body></html>\n"
    )


def to_json_lines(events: Iterable[Event]) -> Iterator[str]:
    for item in mime_stream(events):
        yield json.dumps(item, ensure_ascii=False)
