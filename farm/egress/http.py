"""A proxy request, read and written: its head (h11), where it goes, what goes upstream.

Plain HTTP is one request per connection, rebuilt: origin form, ``Host`` from the target's
authority (never the client's), hop headers dropped, ``Connection: close``, then exactly the
body h11 frames; nothing the client sends after it goes anywhere. ``CONNECT`` is a tunnel to
``host:port``. A refusal says why in its status line, since that is all CONNECT clients show.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

CHUNK = 256 * 1024
HOP_HEADERS = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"host"}
PHRASES = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests"}


class Denied(Exception):
    """A request the proxy refuses: the status it answers with and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass
class Request:
    host: str
    port: int
    head: bytes | None  # what goes upstream first; None for CONNECT (a tunnel)
    parser: h11.Connection  # holds what the client sent after the head

    @property
    def tunnel(self) -> bool:
        return self.head is None


async def read_request(reader: asyncio.StreamReader) -> Request:
    """The client's request head (raises ``ValueError``/h11's errors on anything else)."""
    parser = h11.Connection(h11.SERVER)
    while True:
        event = parser.next_event()
        if isinstance(event, h11.Request):
            return _request(event, parser)
        if event is not h11.NEED_DATA:
            raise ValueError(f"unexpected {type(event).__name__}")
        data = await reader.read(CHUNK)
        if not data:
            raise asyncio.IncompleteReadError(b"", None)
        parser.receive_data(data)


def _request(event: h11.Request, parser: h11.Connection) -> Request:
    method, target = event.method.decode(), event.target.decode()
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"CONNECT needs host:port, not {target!r}")
        return Request(host.strip("[]").lower(), _port(port), None, parser)
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise Denied(400, f"a proxy takes http://host/... or CONNECT host:port, not {target!r}")
    host, number = url.hostname.lower(), _port(str(url.port or 80))
    authority = f"[{host}]" if ":" in host else host
    authority += f":{number}" if url.port else ""
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + authority.encode()]
    lines += [name + b": " + value for name, value in event.headers if name not in HOP_HEADERS]
    lines.append(b"Connection: close")
    return Request(host, number, b"\r\n".join(lines) + b"\r\n\r\n", parser)


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(f"not a port: {text}")
    return port


async def forward_body(
    request: Request, reader: asyncio.StreamReader, send: Callable[[bytes], Awaitable[bool]]
) -> None:
    """Send the plain request's body as h11 frames it (``send`` returns False to stop), then
    nothing more: a second request on the connection is never forwarded."""
    parser = request.parser
    while True:
        event = parser.next_event()
        if isinstance(event, h11.Data):
            if not await send(bytes(event.data)):
                return
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return
        elif event is h11.NEED_DATA:
            data = await reader.read(CHUNK)
            parser.receive_data(data)  # b"": the end of the client's stream
        else:
            raise ValueError(f"unexpected {type(event).__name__}")


def leftover(request: Request) -> bytes:
    """What a tunnel's client sent right after its CONNECT head (the TLS hello, say)."""
    return request.parser.trailing_data[0]


def refusal(status: int, reason: str) -> bytes:
    """A whole refusal: the reason in the body and in the status line."""
    body = f"farm egress: {reason}\n".encode()
    said = re.sub(r"[^\x20-\x7e]", "?", reason)[:300]
    head = (
        f"HTTP/1.1 {status} {PHRASES.get(status, 'Bad Gateway')} (farm egress: {said})\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "X-Farm-Egress: denied\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def refuse(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    with contextlib.suppress(OSError):
        writer.write(refusal(status, reason))
        await writer.drain()
