"""The kernel's server: accepts connections, authenticates them, dispatches requests.

One asyncio loop serves every connection, so a thousand idle or hostile connections cost no
threads (and no pids under ``--pids-limit``). Anything malformed (oversized length, garbage,
non-JSON, unknown type, a bad request) gets an error frame where possible and that connection
is closed; the server keeps serving everyone else. An unauthenticated connection has
``HANDSHAKE_TIMEOUT_S`` and ``HANDSHAKE_MAX_FRAME`` bytes to prove it holds the token.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import signal
import socket
import time
from collections.abc import Mapping
from typing import Any

from .. import KERNEL_VERSION
from ..boxes.pool import BoxPool, Caps
from ..wire import auth
from ..wire.framing import DEFAULT_MAX_FRAME, FrameError, FrameTooLarge, discard, encode, read_frame
from ..wire.protocol import (
    RECOVERABLE_CODES,
    CellEvent,
    EventFrame,
    ExecReply,
    ItemReply,
    Pong,
    Preloaded,
)
from .branch_requests import branch
from .cell import fit
from .items import run_item
from .links import RequestError
from .manager import SessionManager
from .proxy_channel import ProxyChannel
from .requests import Requests, field, wait
from .streaming import Emit

log = logging.getLogger("farm.kernel")

HANDSHAKE_TIMEOUT_S = 5.0
HANDSHAKE_MAX_FRAME = 4096
# An authenticated peer's frame up to this many times the limit is read and dropped (the host
# sent a cell too large: it gets ``too_large`` and keeps its connection); a bigger one closes it.
DISCARD_FACTOR = 4
ROOM_WAITERS = frozenset({"open_session", "item"})  # requests whose box may wait for room


class KernelServer:
    def __init__(
        self,
        token: str,
        zygote: socket.socket,
        *,
        grace_s: float = 2.0,
        max_sessions: int = 256,
        max_connections: int = 1024,
        max_frame: int = DEFAULT_MAX_FRAME,
        pool: BoxPool,
        caps: Caps | None = None,
        tool_limit: int = 3000,
        fallback: str | None = None,
        egress_ca: str | None = None,
        preloaded: Preloaded | None = None,
    ) -> None:
        self._token = token
        self.preloaded: Preloaded = preloaded or {"modules": [], "failed": {}, "seconds": 0.0}
        self.egress_ca = egress_ca
        self.egress = ProxyChannel()
        self.fallback = fallback  # why boxes have no namespaces although asked to
        self.pool = pool
        self.caps = caps
        self.tool_limit = tool_limit
        self._zygote = zygote
        self.grace_s = grace_s
        self.max_sessions = max_sessions
        self.max_connections = max_connections
        self.max_frame = max_frame
        self.requests = Requests(max_frame)
        self.connections = 0
        self.started = time.time()
        self.manager: SessionManager
        self.server: asyncio.base_events.Server

    async def start(self, *, host: str | None, port: int | None, unix: str | None) -> str:
        self.manager = SessionManager(
            self._zygote,
            self.pool,
            grace_s=self.grace_s,
            max_sessions=self.max_sessions,
            tool_limit=self.tool_limit,
            caps=self.caps,
            egress_ca=self.egress_ca,
        )
        self.manager.hand_over = self.egress.hand_over
        if unix is not None:
            if os.path.exists(unix):
                os.unlink(unix)
            old = os.umask(0o077)
            try:
                self.server = await asyncio.start_unix_server(self._serve, path=unix)
            finally:
                os.umask(old)
            return f"unix:{unix}"
        self.server = await asyncio.start_server(self._serve, host=host, port=port)
        sockname = self.server.sockets[0].getsockname()
        return f"tcp:{sockname[0]}:{sockname[1]}"

    def stop(self) -> None:
        self.server.close()
        self.manager.close_all()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= self.max_connections:
            writer.close()
            return
        self.connections += 1
        try:
            if await self._handshake(reader, writer):
                await self._requests(reader, writer)
        except FrameError as exc:
            await _reply(writer, {"type": "error", "code": "bad_frame", "message": str(exc)})
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass
        except asyncio.CancelledError:  # the kernel is shutting down
            pass
        except Exception:
            log.exception("internal error while serving a connection")
            await _reply(writer, {"type": "error", "code": "internal", "message": "kernel bug"})
        finally:
            self.connections -= 1
            self.egress.detach(writer.get_extra_info("socket"))
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        nonce = auth.new_nonce()
        writer.write(
            encode({"type": "hello", "kernel": "farm", "version": KERNEL_VERSION, "nonce": nonce})
        )
        await writer.drain()
        message = await asyncio.wait_for(
            read_frame(reader, HANDSHAKE_MAX_FRAME), HANDSHAKE_TIMEOUT_S
        )
        if message is None:
            return False
        client_nonce = message.get("nonce")
        if (
            message.get("type") != "auth"
            or not isinstance(client_nonce, str)
            or len(client_nonce) != 2 * auth.NONCE_BYTES
            or not auth.verify(self._token, "client", nonce, client_nonce, message.get("mac"))
        ):
            log.warning("a client failed authentication")
            await _reply(
                writer, {"type": "error", "code": "auth_failed", "message": "authentication failed"}
            )
            return False
        proof = auth.mac(self._token, "server", nonce, client_nonce)
        await _reply(writer, {"type": "welcome", "mac": proof, "version": KERNEL_VERSION})
        return True

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ahead: asyncio.Future[dict[str, Any] | None] | None = None
        while True:
            try:
                message = await (ahead or read_frame(reader, self.max_frame))
            except FrameTooLarge as exc:
                if exc.length > DISCARD_FACTOR * self.max_frame:
                    raise
                await discard(reader, exc.length)  # refuse it, keep the connection
                await _reply(writer, {"type": "error", "code": "too_large", "message": str(exc)})
                continue
            finally:
                ahead = None
            if message is None:
                return
            if message["type"] == "answer":  # to a host call whose cell has ended: drop it
                self.manager.answer(message)
                continue
            try:
                if message["type"] == "execute" and message.get("events") and message.get("calls"):
                    # a cell that may call the host: read its answers while it runs
                    work = asyncio.ensure_future(self._dispatch(message, writer))
                    ahead = await self._answers_until(work, reader)
                    reply = await work
                elif message["type"] in ROOM_WAITERS:
                    # its box may wait for room: the host's next read tells if it left meanwhile
                    ahead = asyncio.ensure_future(read_frame(reader, self.max_frame))
                    ahead.add_done_callback(_retrieve)  # read on, or dropped with the connection
                    reply = await self._dispatch(message, writer, ahead)
                else:
                    reply = await self._dispatch(message, writer)
            except RequestError as exc:
                await _reply(writer, {"type": "error", "code": exc.code, "message": str(exc)})
                if exc.code in RECOVERABLE_CODES:
                    continue
                return
            await _reply(writer, reply)

    async def _answers_until(
        self, work: asyncio.Future[Mapping[str, Any]], reader: asyncio.StreamReader
    ) -> asyncio.Future[dict[str, Any] | None]:
        """Route the host's ``answer`` frames to the running cell's calls until ``work`` is
        done; return the read still in flight, which is the connection's next frame (it is
        never cancelled, so a frame is never torn). Anything but an answer now is a
        protocol error."""
        while True:
            read = asyncio.ensure_future(read_frame(reader, self.max_frame))
            pending: set[asyncio.Future[Any]] = {work, read}
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if not read.done() or read.exception() is not None:
                return read
            frame = read.result()
            if frame is None or frame["type"] != "answer":
                if frame is not None:
                    work.add_done_callback(_retrieve)  # the cell goes on; nobody will read it
                    raise FrameError(f"a {frame['type']!r} frame while a cell runs")
                return read
            self.manager.answer(frame)

    async def _dispatch(
        self,
        message: dict[str, Any],
        writer: asyncio.StreamWriter,
        gone: asyncio.Future[Any] | None = None,
    ) -> Mapping[str, Any]:
        """The reply to one request: a frame of ``protocol`` (``egress_attached`` aside);
        ``gone``: the read of the host's next frame, whose end stops a box's wait for room."""
        kind = message["type"]
        if kind == "ping":
            return self.info()
        if kind == "open_session":
            tools = message.get("tools", True)
            if not isinstance(tools, bool):
                raise RequestError("bad_request", "field 'tools' must be a boolean")
            limits = message.get("limits") or {}
            if not isinstance(limits, dict):
                raise RequestError("bad_request", "field 'limits' must be an object")
            wanted = message.get("egress", False)
            if not isinstance(wanted, bool):
                raise RequestError("bad_request", "field 'egress' must be a boolean")
            session_id = message.get("session_id")
            if session_id is not None and not isinstance(session_id, str):
                raise RequestError("bad_request", "field 'session_id' must be a string")
            return await self.manager.open(tools, limits, session_id, wanted, wait(message), gone)
        if kind == "egress_attach":  # this connection now carries boxes' proxy endpoints
            self.egress.attach(writer.get_extra_info("socket"))
            return {"type": "egress_attached"}
        if kind == "execute":
            request = self.requests.execute(message)
            emit = _Starting(writer, request["exec_id"]) if request["events"] else None
            result = await self.manager.execute(request, emit)
            reply: ExecReply = {"type": "exec_result", "result": fit(result, self.max_frame)}
            if emit is not None and emit.held:
                reply["started"] = True
            return reply
        if kind == "close_session":
            return self.manager.close(field(message, "session_id", str))
        if kind == "command":
            return await self.manager.command(self.requests.command(message))
        if kind == "file":
            return await self.manager.file(self.requests.file(message))
        if kind == "item":
            item = self.requests.item(message)
            emitters = item["events"]

            def emit_for(exec_id: str) -> Emit | None:
                return _emitter(writer, exec_id) if emitters else None

            outcome = await run_item(self.manager, item, emit_for, gone)  # fitted there
            done: ItemReply = {"type": "item_result", "result": outcome}
            return done
        if kind == "branch":  # checkpoint, rollback, drop, fork
            return await branch(self.manager, message)
        raise RequestError("unknown_type", f"unknown message type {kind!r}")

    def info(self) -> Pong:
        return {
            "type": "pong",
            "version": KERNEL_VERSION,
            "python": platform.python_version(),
            "pid": os.getpid(),
            "sessions": len(self.manager.sessions),
            "max_sessions": self.max_sessions,
            "uptime_s": time.time() - self.started,
            "grace_s": self.grace_s,
            "max_frame": self.max_frame,
            "isolation": self.pool.isolation,
            "isolation_fallback": self.fallback,
            "box_limits": self.manager.caps.defaults(),
            "opens": self.manager.opens,
            "spare_opens": self.manager.spare_opens,
            "spares": len(self.manager.spawner.spares),
            "quarantined": len(self.pool.quarantined),
            "capacity": self.manager.spawner.capacity(),
            "preload": self.preloaded,
        }


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _emitter(writer: asyncio.StreamWriter, exec_id: str) -> Emit:
    """Intermediate frames of one execute, written in order before its final frame.

    No ``drain`` here (emitters are called from sync code): the volume is bounded by the
    output caps and the display budget of ``CellEvents``, so the transport buffer is too.
    """

    def emit(event: CellEvent) -> None:
        if not writer.is_closing():
            frame: EventFrame = {"type": "event", "exec_id": exec_id, "event": event}
            writer.write(encode(frame))

    return emit


class _Starting:
    """``_emitter`` of one execute that holds its ``started`` event back until another event
    goes out (output, a display, a call, ``running`` after ``TICK_S``): a quick silent cell
    then costs one frame, its reply saying ``started`` instead (``held``)."""

    def __init__(self, writer: asyncio.StreamWriter, exec_id: str) -> None:
        self.emit = _emitter(writer, exec_id)
        self.held = False

    def __call__(self, event: CellEvent) -> None:
        if event["type"] == "started":
            self.held = True
            return
        if self.held:
            self.held = False
            self.emit({"type": "started"})
        self.emit(event)


async def _reply(writer: asyncio.StreamWriter, message: Mapping[str, Any]) -> None:
    try:
        writer.write(encode(message))
        await writer.drain()
    except (ConnectionError, OSError):
        pass


async def serve_forever(
    server: KernelServer, *, host: str | None, port: int | None, unix: str | None, on_ready: Any
) -> None:
    where = await server.start(host=host, port=port, unix=unix)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    on_ready(where)
    stopped = asyncio.ensure_future(stop.wait())
    zygote_lost = asyncio.ensure_future(server.manager.spawner.zygote_lost.wait())
    await asyncio.wait({stopped, zygote_lost}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    zygote_lost.cancel()
    log.info("kernel stopping")
    server.stop()
    if server.manager.spawner.zygote_lost.is_set():
        # Not a clean stop: the exit status tells the sandbox's keeper to replace it.
        raise SystemExit("the zygote died (killed by user code?): the kernel stops")
