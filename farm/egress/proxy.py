"""The egress proxy: serves each box's endpoint with that box's policy, outside the sandbox.

An endpoint is a socket listening on a box's loopback, handed over by its kernel; which box a
connection belongs to is which endpoint accepted it. The proxy accepts on it itself and stops
at the first error (a revoked endpoint is never listened on again). Names are resolved here and
the checked address is the one connected to. Each connection ends in one ``Record``; budgets
are per box (bytes each way, connections open, time each) and for the worker (connections).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import h11

from farm.egress.http import (
    CHUNK,
    Denied,
    Request,
    forward_body,
    leftover,
    read_request,
    refusal,
    refuse,
)
from farm.egress.policy import Policy

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 5.0  # an accepted connection's request head comes within this, or it goes
RESOLVE_TIMEOUT_S = 10.0
STOPPED_KEPT = 4096  # ids of sessions stopped: an endpoint arriving after its stop is closed


@dataclass(frozen=True)
class Limits:
    max_bytes: int  # per box, each way
    max_connections: int  # per box, open at once
    connection_s: float  # per connection
    connect_timeout_s: float = 10.0
    max_total: int = 2048  # open at once, every box of the worker together (its fds)


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
    acceptor: asyncio.Task[None] | None = None
    sent: int = 0
    received: int = 0
    open: int = 0
    spent: bool = False  # a connection was cut at the byte budget: no more for this box
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class EgressProxy:
    """One per worker: an event loop on a thread of its own, serving every box's endpoint."""

    def __init__(self, limits: Limits, report: Report) -> None:
        self.limits = limits
        self.report = report
        self.boxes: dict[str, _Box] = {}
        self.stopped: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.total = 0  # connections open, every box
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
        """Accept on ``endpoint`` for the box, unless its session was stopped already or the
        kernel revoked it (listening no more: listening again would open a new port)."""
        await self._stop(session_id, forget=False)  # a session has one endpoint
        listening = endpoint.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if session_id in self.stopped or not listening:
            endpoint.close()
            return
        box = _Box(session_id, policy)
        self.boxes[session_id] = box
        endpoint.setblocking(False)
        box.acceptor = asyncio.ensure_future(self._accept(box, endpoint))

    async def _accept(self, box: _Box, endpoint: socket.socket) -> None:
        try:
            while True:
                conn, _ = await self.loop.sock_accept(endpoint)
                if box.open >= self.limits.max_connections or self.total >= self.limits.max_total:
                    why = f"over {self.limits.max_connections} open connections a box"
                    with contextlib.suppress(OSError):  # refused before anything is read
                        conn.send(refusal(429, why))
                    conn.close()
                    self._report(box, Record(host="", port=0, allowed=False, reason=why))
                    continue
                box.open += 1  # counted now: the next accept sees it
                self.total += 1
                task = asyncio.ensure_future(self._accepted(box, conn))
                box.tasks.add(task)
                task.add_done_callback(box.tasks.discard)
        except OSError as exc:  # revoked (EINVAL), or closed by ``_stop``
            log.debug("egress endpoint of session %s ends: %s", box.session_id, exc)
        finally:
            endpoint.close()

    async def _accepted(self, box: _Box, conn: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=conn)
            await self._connection(box, reader, writer)
        finally:
            box.open -= 1
            self.total -= 1

    async def _stop(self, session_id: str, grace_s: float = 0.0, forget: bool = True) -> None:
        """No new connection for the box; those open end by themselves within ``grace_s``
        (their box's processes are gone: EOF is on its way) or are cut, reported either way.
        A session stopped before its endpoint came never gets it served (``forget``)."""
        if forget:
            self.stopped[session_id] = None
            while len(self.stopped) > STOPPED_KEPT:
                self.stopped.popitem(last=False)
        box = self.boxes.pop(session_id, None)
        if box is None:
            return
        if box.acceptor is not None:
            box.acceptor.cancel()
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
        refused = 0  # the status a refused request is answered with
        try:
            request = await asyncio.wait_for(read_request(reader), HEAD_TIMEOUT_S)
            record.host, record.port = request.host, request.port
            self._check(box, request)
            record.address = await self._resolve(box.policy, record.host, record.port)
            up_reader, upstream = await self._connect(record)
            record.allowed = True
            if request.tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = leftover(request)
            else:
                first = request.head or b""
            upstream.write(first)
            record.bytes_out = len(first)
            box.sent += record.bytes_out
            record.reason = await self._relay(
                box, record, request, (reader, writer), (up_reader, upstream)
            )
        except Denied as exc:
            record.reason, refused = str(exc), exc.status
        except (h11.RemoteProtocolError, ValueError, asyncio.IncompleteReadError) as exc:
            record.reason, refused = f"not an HTTP proxy request: {exc}", 400
        except TimeoutError:
            record.reason = "no request came"
        except asyncio.CancelledError:
            record.reason = record.reason or "the session ended"
        except OSError as exc:
            record.reason = f"connection error: {exc!r}"
        finally:  # reported before the box sees the end: its run's record can hold it
            record.duration_s = time.monotonic() - started
            self._report(box, record)
            if refused:
                await refuse(writer, refused, record.reason)
            for closing in (writer, upstream):
                if closing is not None:
                    closing.close()

    def _check(self, box: _Box, request: Request) -> None:
        """Refuse what the box's policy or budget does not allow (before any lookup)."""
        if not box.policy.allows(request.host, request.port):
            raise Denied(
                403,
                f"{request.host}:{request.port} is not in this box's egress policy "
                f"(allowed: {box.policy.describe()})",
            )
        if box.spent or max(box.sent, box.received) >= self.limits.max_bytes:
            raise Denied(403, f"the box's budget of {self.limits.max_bytes} bytes is spent")

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
            infos = await asyncio.wait_for(
                self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            raise Denied(502, f"cannot resolve {host}: {exc!r}") from None
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
        request: Request,
        box_side: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        world_side: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> str:
        """Copy until both ways are done (a tunnel: both ends closed; plain HTTP: its one
        body sent and the answer read to its end), the box's budget is spent or the
        connection's time is up; why it was cut off ("" when it simply ended)."""
        (reader, writer), (up_reader, upstream) = box_side, world_side
        over = asyncio.Event()

        async def send(dst: asyncio.StreamWriter, data: bytes, out: bool) -> bool:
            if (box.sent if out else box.received) + len(data) > self.limits.max_bytes:
                box.spent = True  # not forwarded: the box gets at most its budget
                over.set()
                return False
            if out:
                box.sent += len(data)
                record.bytes_out += len(data)
            else:
                box.received += len(data)
                record.bytes_in += len(data)
            dst.write(data)
            await dst.drain()
            return True

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, out: bool) -> None:
            while data := await src.read(CHUNK):
                if not await send(dst, data, out):
                    return
            with contextlib.suppress(OSError):
                if dst.can_write_eof():
                    dst.write_eof()

        async def body(data: bytes) -> bool:
            return await send(upstream, data, True)

        outward = (
            pump(reader, upstream, True) if request.tunnel else forward_body(request, reader, body)
        )
        pumps = {
            asyncio.ensure_future(outward),
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
                    return ""  # a side reset the connection, or sent garbage: it ended
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
