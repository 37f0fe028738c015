"""``farm ui``: a small live page of a farm — its workers, its sessions, and a session's
transcript as it runs.

A Starlette app (served by uvicorn) over the registry and the session journals: the page lists
workers and sessions (polled), and follows one session's journal through server-sent events,
each event a ``mime_stream`` dict plus its safe HTML fragment (``farm.events.transcripts.fragment``:
escaped text, markdown without raw HTML, PNG images, the code's own HTML in a sandboxed frame).
The page loads nothing from elsewhere and runs no inline script (a strict CSP says so).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from farm.events.transcripts import fragment, mime_stream

if TYPE_CHECKING:
    from farm.client import Farm

FOLLOW_BLOCK_MS = 1000
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-src 'self'; connect-src 'self'"
)


def _asset(name: str) -> str:
    return resources.files("farm.ui").joinpath(name).read_text(encoding="utf-8")


def make_app(farm: Farm) -> Starlette:
    page, script, style = _asset("page.html"), _asset("page.js"), _asset("page.css")
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-store"}

    def index(request: Request) -> Response:
        return HTMLResponse(page, headers=headers)

    def asset(request: Request) -> Response:
        name = request.path_params["name"]
        body, kind = {"page.js": (script, "text/javascript"), "page.css": (style, "text/css")}.get(
            name, ("", "")
        )
        if not body:
            return Response("not found", status_code=404)
        return Response(body, media_type=kind, headers=headers)

    def workers(request: Request) -> Response:
        return JSONResponse(farm.workers())

    def sessions(request: Request) -> Response:
        live = {str(s["id"]): s for s in farm.registry.sessions()}
        rows = []
        for session_id, last in farm.journal.sessions():
            entry = live.pop(session_id, None)
            rows.append(_session_row(session_id, last, entry))
        rows.extend(_session_row(sid, None, entry) for sid, entry in live.items())
        return JSONResponse(rows)

    async def events(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        after = request.headers.get("last-event-id") or "0"
        return StreamingResponse(
            _follow(farm, session_id, after),
            media_type="text/event-stream",
            headers={**headers, "X-Accel-Buffering": "no"},
        )

    return Starlette(
        routes=[
            Route("/", index),
            Route("/static/{name}", asset),
            Route("/api/workers", workers),
            Route("/api/sessions", sessions),
            Route("/api/sessions/{session_id}/events", events),
        ]
    )


def _session_row(session_id: str, last: float | None, entry: dict[str, Any] | None) -> Any:
    return {
        "id": session_id,
        "last_event": last,
        "live": entry is not None,
        "worker": (entry or {}).get("worker"),
        "image": (entry or {}).get("image"),
    }


async def _follow(farm: Farm, session_id: str, after: str) -> AsyncIterator[str]:
    """The journal from ``after`` on, then every new event as it is appended (SSE)."""
    yield "retry: 1000\n\n"
    while True:
        after_id, batch = await asyncio.to_thread(
            farm.journal.follow_ids, session_id, after, FOLLOW_BLOCK_MS
        )
        if not batch:
            yield ": idle\n\n"  # lets a closed connection be noticed
            continue
        for entry_id, event in batch:
            item = next(mime_stream([event]))
            item["html"] = fragment(item)
            yield f"id: {entry_id}\ndata: {json.dumps(item)}\n\n"
        after = after_id


def serve(farm: Farm, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the page until interrupted (uvicorn)."""
    import uvicorn

    uvicorn.run(make_app(farm), host=host, port=port, log_level="warning")
