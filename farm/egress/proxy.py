"""The egress proxy: serves each box's endpoint with that box's policy, outside the sandbox.

An endpoint is a socket listening on a box's loopback, handed over by its kernel; which box a
connection belongs to is which endpoint accepted it, never anything the box sends. HTTPS goes
through ``CONNECT`` (host and port seen, never content), plain HTTP is forwarded one request
per connection. A name is resolved here, the address checked, and that address connected to
(no second lookup). Denials answer at once (403, 429, 502) with the reason; every connection
ends in one ``Record``. Budgets are per box: bytes each way, open connections, time each.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11

from farm.egress.policy import Policy

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 30.0
CHUNK = 256 * 1024
HOP_HEADERS = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization"}


@dataclass(frozen=True)
class Limits:
    max_bytes: int  # per box, each way
    max_connections: int  # per box, open at once
    connection_s: float  # per connection
    connect_timeout_s: float = 10.0


@dataclass
class Record:
    """One connection through a box's endpoint, as it ended."""

    host: str
    port: int
    allowed: bool
    reason: str = ""
    address: str = ""
    bytes_out: int = 0  # box -> world
    bytes_in: int = 0  # world -> box
    duration_s: float = 0.0


Report = Callable[[str, Record], None]  # session id, record (called on the proxy's thread)


@dataclass
class _Box:
    session_id: str
    policy: Policy
    server: asyncio.AbstractServer | None = None
    sent: int = 0
    received: int = 0
    open: int = 0
    spent: bool = False  # a connection was cut at the byte budget: no more for this box
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class Denied(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class EgressProxy:
    """One per worker: an event loop on a thread of its own, serving every box's endpoint."""

    def __init__(self, limits: Limits, report: Report) -> None:
        self.limits = limits
        self.report = report
        self.boxes: dict[str, _Box] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="farm-egress")
        self._thread.daemon = True
        self._thread.start()

    def serve(self, session_id: str, endpoint: socket.socket, policy: Policy) -> None:
        """Serve ``endpoint`` (this call owns it now) with ``policy``, until ``stop``."""
        asyncio.run_coroutine_threadsafe(self._serve(session_id, endpoint, policy), self.loop)

    def open_connections(self, session_id: str) -> int:
        box = self.boxes.get(session_id)
        return box.open if box is not None else 0

    def stop(self, session_id: str, wait_s: float = 0.0) -> None:
        """Close the box's endpoint and end its connections (the session ended); with
        ``wait_s``, wait that long for them to end by themselves and be reported."""
        if self.loop.is_closed():
            return
        stopped = asyncio.run_coroutine_threadsafe(self._stop(session_id, wait_s), self.loop)
        if wait_s:
            with contextlib.suppress(Exception):
                stopped.result(wait_s + 1.0)

    def close(self) -> None:
        async def stop_all() -> None:
            for session_id in list(self.boxes):
                await self._stop(session_id)

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(stop_all(), self.loop).result(5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        if not self.loop.is_running():
            self.loop.close()

    async def _serve(self, session_id: str, endpoint: socket.socket, policy: Policy) -> None:
        await self._stop(session_id)  # a session has one endpoint
        box = _Box(session_id, policy)
        self.boxes[session_id] = box

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            box.tasks.add(task)
            try:
                await self._connection(box, reader, writer)
            finally:
                box.tasks.discard(task)

        try:
            endpoint.setblocking(False)
            box.server = await asyncio.start_server(accepted, sock=endpoint)
        except OSError as exc:  # revoked already (the session ended at once)
            log.info("egress endpoint of session %s: %s", session_id, exc)
            endpoint.close()

    async def _stop(self, session_id: str, grace_s: float = 0.0) -> None:
        """No new connection for the box; those open end by themselves within ``grace_s``
        (their box's processes are gone: EOF is on its way) or are cut, reported either way."""
        box = self.boxes.pop(session_id, None)
        if box is None:
            return
        if box.server is not None:
            box.server.close()
        if box.tasks and grace_s:
            await asyncio.wait(list(box.tasks), timeout=grace_s)
        running = list(box.tasks)
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    async def _connection(
        self, box: _Box, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        started = time.monotonic()
        record = Record(host="", port=0, allowed=False)
        upstream: asyncio.StreamWriter | None = None
        refusal = 0  # the status a refused request is answered with
        box.open += 1
        try:
            method, target, head, rest = await asyncio.wait_for(_read_head(reader), HEAD_TIMEOUT_S)
            record.host, record.port, request = _destination(method, target, head)
            if box.open > self.limits.max_connections:
                raise Denied(429, f"over {self.limits.max_connections} open connections a box")
            if not box.policy.allows(record.host, record.port):
                raise Denied(
                    403,
                    f"{record.host}:{record.port} is not in this box's egress policy "
                    f"(allowed: {box.policy.describe()})",
                )
            if box.spent or max(box.sent, box.received) >= self.limits.max_bytes:
                raise Denied(403, f"the box's budget of {self.limits.max_bytes} bytes is spent")
            record.address = await self._resolve(box.policy, record.host, record.port)
            up_reader, upstream = await self._connect(record)
            record.allowed = True
            if request is None:  # CONNECT: a tunnel
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.write(request)
            upstream.write(rest)
            record.bytes_out = len(request or b"") + len(rest)
            box.sent += record.bytes_out
            record.reason = await self._relay(box, record, (reader, writer), (up_reader, upstream))
        except Denied as exc:
            record.reason, refusal = str(exc), exc.status
        except (h11.RemoteProtocolError, ValueError, asyncio.IncompleteReadError) as exc:
            record.reason, refusal = f"not an HTTP proxy request: {exc}", 400
        except TimeoutError:
            record.reason = "no request came"
        except asyncio.CancelledError:
            record.reason = record.reason or "the session ended"
        except OSError as exc:
            record.reason = f"connection error: {exc!r}"
        finally:  # reported before the box sees the end: its run's record can hold it
            box.open -= 1
            record.duration_s = time.monotonic() - started
            if record.host or record.reason:
                self._report(box, record)
            if refusal:
                await _refuse(writer, refusal, record.reason)
            for closing in (writer, upstream):
                if closing is not None:
                    closing.close()

    async def _resolve(self, policy: Policy, host: str, port: int) -> str:
        """The address to connect to: the first the name resolves to that is allowed."""
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            pass
        else:  # an address: nothing to resolve
            why = policy.address_refused(str(literal))
            if why is not None:
                raise Denied(403, why)
            return str(literal)
        try:
            infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Denied(502, f"cannot resolve {host}: {exc}") from None
        refusals = []
        for info in infos:
            address = str(info[4][0])
            why = policy.address_refused(address)
            if why is None:
                return address
            refusals.append(why)
        raise Denied(403, f"{host} resolves only to refused addresses: {'; '.join(refusals)}")

    async def _connect(self, record: Record) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(record.address, record.port),
                self.limits.connect_timeout_s,
            )
        except (TimeoutError, OSError) as exc:
            why = f"could not connect to {record.host}:{record.port}: {exc!r}"
            raise Denied(502, why) from None

    async def _relay(
        self,
        box: _Box,
        record: Record,
        box_side: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        world_side: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> str:
        """Copy both ways until both sides end, the box's budget is spent or the connection's
        time is up; why it was cut off ("" when it simply ended)."""
        (reader, writer), (up_reader, upstream) = box_side, world_side
        over = asyncio.Event()

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, out: bool) -> None:
            while data := await src.read(CHUNK):
                if (box.sent if out else box.received) + len(data) > self.limits.max_bytes:
                    box.spent = True  # not forwarded: the box gets at most its budget
                    over.set()
                    return
                if out:
                    box.sent += len(data)
                    record.bytes_out += len(data)
                else:
                    box.received += len(data)
                    record.bytes_in += len(data)
                dst.write(data)
                await dst.drain()
            with contextlib.suppress(OSError):
                if dst.can_write_eof():
                    dst.write_eof()

        pumps = {
            asyncio.ensure_future(pump(reader, upstream, True)),
            asyncio.ensure_future(pump(up_reader, writer, False)),
        }
        deadline = self.loop.time() + self.limits.connection_s
        pending = set(pumps)
        try:
            while pending:
                left = deadline - self.loop.time()
                if left <= 0:
                    return f"cut off after {self.limits.connection_s:g} s (its time limit)"
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if over.is_set():
                    return f"cut off: the box's budget of {self.limits.max_bytes} bytes is spent"
                if any(not p.cancelled() and p.exception() is not None for p in done):
                    return ""  # a side reset the connection: it simply ended
            return ""
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    def _report(self, box: _Box, record: Record) -> None:
        try:
            self.report(box.session_id, record)
        except Exception:
            log.exception("egress record of session %s not reported", box.session_id)


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, h11.Request, bytes]:
    """The request's method, target and head (h11 parses it), and what came after the head."""
    conn = h11.Connection(h11.SERVER)
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            method, target = event.method.decode(), event.target.decode()
            return method, target, event, conn.trailing_data[0]
        if event is not h11.NEED_DATA:
            raise ValueError(f"unexpected {type(event).__name__}")
        data = await reader.read(CHUNK)
        if not data:
            raise asyncio.IncompleteReadError(b"", None)
        conn.receive_data(data)


def _destination(method: str, target: str, head: h11.Request) -> tuple[str, int, bytes | None]:
    """Host, port and, for plain HTTP, the request to send upstream (origin form, one request:
    ``Connection: close``); ``None`` for ``CONNECT``."""
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"CONNECT needs host:port, not {target!r}")
        return host.strip("[]").lower(), int(port), None
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise Denied(400, f"a proxy takes http://host/... or CONNECT host:port, not {target!r}")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    lines = [f"{method} {path} HTTP/1.1".encode()]
    lines += [name + b": " + value for name, value in head.headers if name not in HOP_HEADERS]
    lines.append(b"Connection: close")
    return url.hostname.lower(), url.port or 80, b"\r\n".join(lines) + b"\r\n\r\n"


async def _refuse(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = f"farm egress: {reason}\n".encode()
    phrase = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests"}.get(
        status, "Bad Gateway"
    )
    # The reason in the status line too: a CONNECT client shows only that ("Tunnel connection
    # failed: 403 Forbidden (...)"), never the body.
    said = re.sub(r"[^\x20-\x7e]", "?", reason)[:300]
    head = (
        f"HTTP/1.1 {status} {phrase} (farm egress: {said})\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "X-Farm-Egress: denied\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        writer.write(head.encode() + body)
        await writer.drain()
