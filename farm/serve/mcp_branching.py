"""The MCP tools of checkpoints: ``checkpoint`` and ``rollback`` of the conversation's session.

An MCP conversation holds one session (``mcp_server.Workspace``), so a fork (sessions of their
own) has no tool here; the HTTP API and the client have it. Design: docs/design/fork.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mcp.server.fastmcp import Context, FastMCP

from farm.errors import BranchRefused

if TYPE_CHECKING:
    from farm.client import Session


def add_tools(server: FastMCP[Any], session_of: Callable[[Any], Awaitable[Session]]) -> None:
    """Add the tools to ``server``; ``session_of(ctx)`` is the conversation's session."""

    @server.tool()
    async def checkpoint(ctx: Context[Any, Any, Any]) -> str:
        """Keep the session as it is now (variables, imports, files); returns the checkpoint's
        id, for rollback. At most 8 are kept at once."""
        session = await session_of(ctx)
        try:
            cp = await asyncio.to_thread(session.checkpoint)
        except BranchRefused as exc:
            return f"no checkpoint: {exc}"
        return cp.id

    @server.tool()
    async def rollback(checkpoint_id: str, ctx: Context[Any, Any, Any]) -> str:
        """Return the session exactly to a checkpoint: its variables, imports and files;
        processes started since are ended. The checkpoint stays, to return to again."""
        session = await session_of(ctx)
        try:
            await asyncio.to_thread(session.rollback, checkpoint_id)
        except BranchRefused as exc:
            return f"no rollback: {exc}"
        return f"rolled back to {checkpoint_id}"
