"""The ASGI app of ``farm serve``: the ``/v1`` API, ``/mcp``, the live page, health checks.

One FastAPI app over one ``Farm``: the routers (``sessions``, ``files``, ``runs``) call the
client, ``problems`` turns every refusal into an RFC 9457 document, ``access`` checks tokens
and owners. Bodies are bounded before anything is parsed (``BodyLimit``: over
``api_max_body_bytes`` is a 413), except the two that stream (a file's PUT, a map's lines,
each line bounded by the map). The OpenAPI document is the app's own (``docs/openapi.json``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import farm
from farm.serve import branch_routes, file_routes, judge0, runs, session_routes, snapshot_routes
from farm.serve.access import Sessions, Slots, authenticate, bearer
from farm.serve.problem_documents import ProblemError, install, problem
from farm.serve.tokens import TokenStore
from farm.settings import FarmSettings

if TYPE_CHECKING:
    from farm.client import Farm

STREAMED = re.compile(r"^/v1/(map|sessions/[^/]+/files/.+)$")
UI_PATHS = re.compile(r"^/($|static/|api/)")
COOKIE = "farm_token"


def make_app(
    farm_: Farm | None = None,
    store: TokenStore | None = None,
    settings: FarmSettings | None = None,
    *,
    host: str = "127.0.0.1",
) -> FastAPI:
    """The app over ``farm_`` (``None``: routes only, for the OpenAPI document)."""
    settings = settings or FarmSettings()
    mcp = None
    if farm_ is not None:
        from farm.serve.mcp_server import build

        mcp = build(farm_, host=host)
        mcp.streamable_http_app()  # makes its session manager, run by the lifespan

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # every route reaches the farm through asyncio.to_thread: its threads are the calls
        # the server runs at once, and a map, or an open waiting for room, holds one
        threads = ThreadPoolExecutor(settings.api_threads, thread_name_prefix="farm-api")
        asyncio.get_running_loop().set_default_executor(threads)
        async with contextlib.AsyncExitStack() as stack:
            if mcp is not None:
                await stack.enter_async_context(mcp.session_manager.run())
            if farm_ is not None:
                runner = await asyncio.to_thread(judge0.start, app, farm_, settings)
                stack.callback(runner.stop)
            yield
            if farm_ is not None:
                app.state.sessions.close_all()

    app = FastAPI(
        title="farm",
        version=farm.__version__,
        summary="A sandboxed Python execution farm over HTTP",
        description="Sessions, runs, commands, files and maps of a farm (`farm serve`). "
        "Every route needs `Authorization: Bearer <token>`; errors are RFC 9457 problem "
        "documents whose `kind` is farm's error kind.",
        lifespan=lifespan,
    )
    install(app)
    app.include_router(session_routes.router)
    app.include_router(branch_routes.router)
    app.include_router(snapshot_routes.router)
    app.include_router(file_routes.router)
    app.include_router(runs.router)
    app.include_router(judge0.router)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.state.farm = farm_
    app.state.tokens = store
    app.state.settings = settings
    app.state.slots = Slots()
    if mcp is not None:
        from mcp.server.fastmcp.server import StreamableHTTPASGIApp

        handler = StreamableHTTPASGIApp(mcp.session_manager)
        app.router.routes.append(Route("/mcp", Guarded(handler, store, "run")))
    if farm_ is not None:
        from farm.ui import make_app as make_ui

        app.state.sessions = Sessions(farm_)
        app.mount("/", Guarded(make_ui(farm_), store, "admin", ui=True))  # last: the rest
    app.add_middleware(BodyLimit, limit=settings.api_max_body_bytes)
    return app


class Guarded:
    """An ASGI app behind the API's tokens (the live page and ``/mcp``). The page also takes
    its token once as ``/?token=...``, kept in an HttpOnly cookie, since a browser's
    ``EventSource`` sends no headers."""

    def __init__(self, app: ASGIApp, store: TokenStore | None, scope: str, ui: bool = False):
        self.app, self.store, self.scope, self.ui = app, store, scope, ui

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.requests import Request

        request = Request(scope)
        if self.ui and not UI_PATHS.match(request.url.path):
            await problem(404, "not_found", "no such route", instance=request.url.path)(
                scope, receive, send
            )
            return
        presented = bearer(request) or request.query_params.get("token")
        presented = presented or (request.cookies.get(COOKIE) if self.ui else None)
        try:
            assert self.store is not None
            authenticate(self.store, presented, self.scope)
        except ProblemError as exc:
            response = problem(exc.status, exc.kind, exc.detail, headers=exc.headers)
            await response(scope, receive, send)
            return
        if self.ui and "token" in request.query_params:  # keep it, and drop it from the URL
            from starlette.responses import RedirectResponse

            redirect = RedirectResponse(request.url.path, status_code=303)
            redirect.set_cookie(COOKIE, str(presented), httponly=True, samesite="strict")
            await redirect(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuse a body over ``limit`` bytes (413) before the app parses any of it; the streamed
    routes (``STREAMED``) read theirs as it comes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or STREAMED.match(scope["path"]) or scope["path"] == "/mcp":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        body, messages = 0, []
        while True:
            message = await receive()
            messages.append(message)
            body += len(message.get("body", b""))
            if body > self.limit:
                await self._refuse(scope, receive, send)
                return
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"the body is over the limit of {self.limit} bytes"
        await problem(413, "input", detail, instance=scope["path"])(scope, receive, send)


def openapi_document() -> str:
    """``docs/openapi.json``: the app's OpenAPI document, as committed."""
    app = make_app()
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # python -m farm.serve.app > docs/openapi.json
    print(openapi_document(), end="")
