"""farm as an MCP server, called by the ``mcp`` SDK's own client: ``farm mcp`` over stdio and
``/mcp`` on ``farm serve`` over streamable HTTP, both over a real farm (Docker sandboxes).
A tool call defines a variable and the next one uses it; a PNG value arrives as an image; the
farm session ends with the MCP session."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, ImageContent, TextContent

from farm.client import Farm
from tests.serving import FARM, Server, farm_serve
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# a 1x1 PNG, shown by the value's _repr_png_
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAA"
    "AABJRU5ErkJggg=="
)
CHART = f"""
import base64
class Chart:
    def _repr_png_(self):
        return base64.b64decode('{PNG}')
Chart()
"""


@pytest.fixture(scope="module")
def server(farm: Farm, tmp_path_factory: Any) -> Iterator[Server]:
    with farm_serve(farm.settings.redis_url, tmp_path_factory.mktemp("serve")) as s:
        yield s


def text(result: CallToolResult) -> str:
    assert not result.isError, result.content
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def converse(session: ClientSession) -> None:
    """The tool calls both transports must answer alike."""
    await session.initialize()
    names = {tool.name for tool in (await session.list_tools()).tools}
    assert names == {
        "run_python",
        "run_command",
        "read_file",
        "write_file",
        "list_files",
        "snapshot_session",
        "restore_session",
        "reset_session",
        "checkpoint",
        "rollback",
    }
    await session.call_tool("run_python", {"code": "x = 20"})
    kept = text(await session.call_tool("checkpoint", {}))
    await session.call_tool("run_python", {"code": "x = 99"})
    assert text(await session.call_tool("rollback", {"checkpoint_id": kept})).startswith("rolled")
    assert text(await session.call_tool("run_python", {"code": "print('hi')\nx + 22"})) == "hi\n42"
    failed = await session.call_tool("run_python", {"code": "1/0"})
    assert "ZeroDivisionError" in text(failed) and "[error: user]" in text(failed)
    image = await session.call_tool("run_python", {"code": CHART})
    pictures = [c for c in image.content if isinstance(c, ImageContent)]
    assert len(pictures) == 1 and pictures[0].mimeType == "image/png"
    assert base64.b64decode(pictures[0].data) == base64.b64decode(PNG)
    await session.call_tool("write_file", {"path": "notes/a.txt", "content": "hello"})
    assert text(await session.call_tool("read_file", {"path": "notes/a.txt"})) == "hello"
    assert "notes/a.txt" in text(await session.call_tool("list_files", {"path": "notes"}))
    done = text(await session.call_tool("run_command", {"command": "cat notes/a.txt; exit 3"}))
    assert done.startswith("exit status 3") and "hello" in done
    kept = text(await session.call_tool("snapshot_session", {}))
    snapshot_id = kept.split()[1].rstrip(":")
    await session.call_tool("run_python", {"code": "x = 0"})
    await session.call_tool("restore_session", {"snapshot_id": snapshot_id})
    assert text(await session.call_tool("run_python", {"code": "x"})) == "20"
    assert text(await session.call_tool("read_file", {"path": "notes/a.txt"})) == "hello"
    await session.call_tool("reset_session", {})
    gone = await session.call_tool("run_python", {"code": "x"})
    assert "NameError" in text(gone)  # a fresh session


def open_sessions(farm: Farm) -> set[str]:
    return {str(s["id"]) for s in farm.registry.sessions()}


def run(conversation: AbstractAsyncContextManager[ClientSession], farm: Farm) -> None:
    before = open_sessions(farm)

    async def main() -> set[str]:
        async with conversation as session:
            await converse(session)
            return open_sessions(farm) - before

    during = asyncio.run(main())
    assert len(during) == 1  # the fresh session after the reset
    # the MCP session ended: its farm session is closed
    assert wait_for(lambda: not (open_sessions(farm) & during), 30), "the session was left open"


class Stdio:
    def __init__(self, env: dict[str, str]) -> None:
        self.params = StdioServerParameters(command=FARM, args=["mcp"], env=env)

    async def __aenter__(self) -> ClientSession:
        self.transport = stdio_client(self.params)
        read, write = await self.transport.__aenter__()
        self.session = ClientSession(read, write)
        return await self.session.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        await self.session.__aexit__(*exc)
        await self.transport.__aexit__(*exc)


class StreamableHttp:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    async def __aenter__(self) -> ClientSession:
        self.http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {self.token}"}, timeout=httpx.Timeout(60)
        )
        self.transport = streamable_http_client(self.url, http_client=self.http)
        read, write, _ = await self.transport.__aenter__()
        self.session = ClientSession(read, write)
        return await self.session.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        await self.session.__aexit__(*exc)
        await self.transport.__aexit__(*exc)
        await self.http.aclose()


def test_farm_mcp_over_stdio(farm: Farm) -> None:
    env = {**os.environ, "FARM_BROKER_URL": farm.settings.redis_url}
    run(Stdio(env), farm)


def test_mcp_over_streamable_http(farm: Farm, server: Server) -> None:
    run(StreamableHttp(f"{server.url}/mcp", server.token("agent", "run")), farm)
