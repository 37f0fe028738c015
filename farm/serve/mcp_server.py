"""farm as an MCP server (the official ``mcp`` SDK's FastMCP): ``farm mcp`` over stdio and
``/mcp`` (streamable HTTP) on ``farm serve``.

Tools: ``run_python`` (a persistent session per MCP session: a variable one call defines, the
next one uses), ``run_command``, ``read_file``, ``write_file``, ``list_files``,
``snapshot_session``, ``restore_session`` and ``reset_session``. Results are text, plus an
image for every ``image/png`` the code showed (its value or ``display``). The farm session is
opened at the first call and closed when the MCP session ends (the SDK runs the server's
lifespan once per MCP session, over either transport), so an agent that disconnects leaves
nothing running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from mcp.server.fastmcp import Context, FastMCP
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ImageContent, TextContent

from farm.events.run_events import Display
from farm.models import CommandResult, ExecResult
from farm.serve import mcp_branching

if TYPE_CHECKING:
    from farm.client import Farm, Session

log = logging.getLogger(__name__)
Content = TextContent | ImageContent
INSTRUCTIONS = (
    "A sandboxed Python REPL (no network): variables persist between run_python calls of this "
    "MCP session; files live in its workspace. reset_session starts afresh."
)


class Workspace:
    """One MCP session's farm session, opened at its first use and closed at the end."""

    def __init__(self, farm: Farm) -> None:
        self.farm = farm
        self.session: Session | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Session:
        async with self._lock:
            if self.session is None or self.session.closed:
                self.session = await asyncio.to_thread(self.farm.session)
                log.info("MCP session opened farm session %s", self.session.id)
            return self.session

    async def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            log.info("MCP session ended: closing farm session %s", session.id)
            await asyncio.to_thread(session.close)


def build(farm: Farm, *, host: str = "127.0.0.1") -> FastMCP[Workspace]:
    """The MCP server over ``farm`` (``host``: where ``/mcp`` is served, for its Host check)."""

    @contextlib.asynccontextmanager
    async def per_session(_: FastMCP[Workspace]) -> AsyncIterator[Workspace]:
        workspace = Workspace(farm)
        try:
            yield workspace
        finally:
            await workspace.close()

    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    if host in ("127.0.0.1", "localhost", "::1"):
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    server: FastMCP[Workspace] = FastMCP(
        "farm",
        instructions=INSTRUCTIONS,
        lifespan=per_session,
        log_level="WARNING",  # FastMCP would set up logging at INFO otherwise
        streamable_http_path="/mcp",
        transport_security=security,
    )

    def workspace(ctx: Context[Any, Workspace, Any]) -> Workspace:
        found: Workspace = ctx.request_context.lifespan_context
        return found

    async def session_of(ctx: Context[Any, Workspace, Any]) -> Session:
        return await workspace(ctx).get()

    mcp_branching.add_tools(server, session_of)

    @server.tool(structured_output=False)
    async def run_python(
        code: str, ctx: Context[Any, Workspace, Any], timeout_s: float = 30.0
    ) -> list[Content]:
        """Run Python code in this conversation's sandboxed session; variables, imports and
        files persist between calls. The last expression's value is shown, with stdout,
        stderr and any error's traceback; PNG images (matplotlib, display) come as images."""
        session = await workspace(ctx).get()
        stream = session.stream(code, timeout_s)
        displays = await asyncio.to_thread(lambda: [e for e in stream if isinstance(e, Display)])
        assert stream.result is not None
        return result_content(stream.result, displays)

    @server.tool(structured_output=False)
    async def run_command(
        command: str, ctx: Context[Any, Workspace, Any], timeout_s: float = 30.0
    ) -> list[Content]:
        """Run a shell command (sh -c) in the session's workspace; returns its exit status,
        stdout and stderr."""
        session = await workspace(ctx).get()
        result = await asyncio.to_thread(session.exec, command, timeout_s=timeout_s)
        return [TextContent(type="text", text=command_text(result))]

    @server.tool()
    async def read_file(path: str, ctx: Context[Any, Workspace, Any]) -> str:
        """The text of a file in the session's workspace (UTF-8; undecodable bytes replaced)."""
        session = await workspace(ctx).get()
        data = await asyncio.to_thread(session.files.read, path, max_bytes=8 << 20)
        return data.decode("utf-8", errors="replace")

    @server.tool()
    async def write_file(path: str, content: str, ctx: Context[Any, Workspace, Any]) -> str:
        """Create or replace a file in the session's workspace (parents are made)."""
        session = await workspace(ctx).get()
        size = await asyncio.to_thread(session.files.write, path, content)
        return f"wrote {size} bytes to {path}"

    @server.tool()
    async def list_files(ctx: Context[Any, Workspace, Any], path: str = ".") -> str:
        """The entries of a workspace directory, one a line: type, size, path."""
        session = await workspace(ctx).get()
        entries = await asyncio.to_thread(session.files.list, path)
        lines = [f"{e.get('type')}\t{e.get('size', 0)}\t{e.get('path')}" for e in entries]
        return "\n".join(lines) or "(empty)"

    @server.tool()
    async def snapshot_session(ctx: Context[Any, Workspace, Any]) -> str:
        """Keep a snapshot of this session (variables and workspace files) in the farm: its id
        (for restore_session) and the variables it could not carry, with why."""
        snap = await asyncio.to_thread((await workspace(ctx).get()).snapshot, keep=True)
        lost = "".join(f"\nnot carried: {k} ({why})" for k, why in snap.info.lost.items())
        kept = f"{len(snap.info.names)} variables, {snap.info.files} files"
        return f"snapshot {snap.id}: {kept}{lost}"

    @server.tool()
    async def restore_session(snapshot_id: str, ctx: Context[Any, Workspace, Any]) -> str:
        """Replace this conversation's session by one restored from a kept snapshot."""
        restored = await asyncio.to_thread(farm.restore, snapshot_id)
        held = workspace(ctx)
        await held.close()
        held.session = restored
        return f"session {restored.id} restored from snapshot {snapshot_id}"

    @server.tool()
    async def reset_session(ctx: Context[Any, Workspace, Any]) -> str:
        """Close this conversation's session: the next call starts in a fresh one."""
        await workspace(ctx).close()
        return "the session was closed; the next call opens a fresh one"

    return server


def result_content(result: ExecResult, displays: list[Display]) -> list[Content]:
    """A run as MCP content: one text block, then each PNG as an image."""
    parts: list[str] = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append(f"[stderr]\n{result.stderr.rstrip()}")
    if result.value is not None:
        parts.append(result.value.text)
    if result.error is not None:
        trace = "".join(result.error.traceback) or f"{result.error.ename}: {result.error.evalue}"
        parts.append(f"[error: {result.error.kind.value}]\n{trace.rstrip()}")
    content: list[Content] = [TextContent(type="text", text="\n".join(parts) or "(no output)")]
    bundles = [d.value.data for d in displays] + ([result.value.data] if result.value else [])
    for bundle in bundles:
        png = bundle.get("image/png")
        if isinstance(png, str):
            content.append(ImageContent(type="image", data=png, mimeType="image/png"))
    return content


def command_text(result: CommandResult) -> str:
    lines = [f"exit status {result.returncode}" + (" (timed out)" if result.timed_out else "")]
    if result.stdout:
        lines.append(f"[stdout]\n{result.stdout.rstrip()}")
    if result.stderr:
        lines.append(f"[stderr]\n{result.stderr.rstrip()}")
    return "\n".join(lines)


def run_stdio(farm: Farm) -> None:
    """``farm mcp``: serve MCP on stdin/stdout until the host closes it."""
    build(farm).run("stdio")
