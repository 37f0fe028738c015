"""Transcripts: any stream of events (live or replayed) as portable MIME dicts, markdown,
JSON lines or a static HTML page. Used by the CLI (``farm replay``), the live page and sweeps;
the live stream itself is ``farm.client.stream.EventStream``.

Every rendering is bounded (the events' own renderings are) and the HTML runs no code from the
sandbox: the code's own HTML goes into sandboxed frames, markdown is rendered without raw HTML.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Iterator
from typing import Any

from farm.events.run_events import Event, parse_event

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
