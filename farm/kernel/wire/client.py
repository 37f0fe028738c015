"""``KernelClient``: the stdlib client of the kernel protocol, reused by every host-side layer.

Invariants: one request at a time per connection (a lock; open several for concurrency); every
socket operation has a deadline (an execute waits ``timeout_s + grace + slack``); failures
raise ``KernelError``s (``farm.kernel.wire.wire_errors``, under ``FarmError``). A request is
an exchange: intermediate frames (a running cell's events, host calls) go to ``on_frame``, the
final frame is returned. More: docs/design/host-callbacks.md, docs/design/errors.md.
"""

from __future__ import annotations

import base64
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Union, cast

from . import auth, protocol
from .branch_frames import Branch, Branched
from .framing import DEFAULT_MAX_FRAME, FrameError, recv_frame, send_frame
from .protocol import DEFAULT_WAIT_S, RECOVERABLE_CODES
from .wire_errors import FarmError as FarmError
from .wire_errors import KernelAuthError as KernelAuthError
from .wire_errors import KernelConnectionError as KernelConnectionError
from .wire_errors import KernelError as KernelError
from .wire_errors import KernelProtocolError as KernelProtocolError
from .wire_errors import KernelRequestError as KernelRequestError

DEFAULT_TIMEOUT_S = 30.0
INTERMEDIATE = {"event"}  # frame types a kernel may send before the final reply
REQUEST_SLACK_S = 15.0
FILE_TIMEOUT_S = 150.0

Request = Union[  # what a host sends (an ``answer`` goes back through ``on_frame``)
    protocol.Ping,
    protocol.OpenSession,
    protocol.EgressAttach,
    protocol.Execute,
    protocol.CloseSession,
    protocol.Command,
    protocol.FileRequest,
    protocol.Item,
    Branch,
]
Check = Callable[[dict[str, Any]], object]  # raises ValueError on a frame it refuses


def parse_address(address: str) -> tuple[int, Any]:
    """``unix:/p``, ``/p`` -> a Unix socket; ``host:port`` or ``tcp:host:port`` -> TCP."""
    if address.startswith("unix:"):
        return socket.AF_UNIX, address[5:]
    if address.startswith("/"):
        return socket.AF_UNIX, address
    host, _, port = address.removeprefix("tcp:").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not a kernel address: {address!r}")
    return socket.AF_INET, (host, int(port))


def connect_socket(address: str, timeout_s: float) -> socket.socket:
    family, target = parse_address(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(target)
    except BaseException:
        sock.close()
        raise
    if family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class KernelClient:
    """A connection to one kernel: ``KernelClient(host, port, token)`` or ``.at(addr, token)``."""

    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        token: str = "",
        *,
        address: str | None = None,
        connect_timeout_s: float = 5.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        check: Check | None = None,
    ) -> None:
        self.address = address or f"{host}:{port}"
        self._token = token
        self.connect_timeout_s = connect_timeout_s
        self.max_frame = max_frame
        self.check = check  # the host's validator of every frame that comes back
        self.kernel_version: str | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    @classmethod
    def at(cls, address: str, token: str, **kwargs: Any) -> KernelClient:
        return cls(token=token, address=address, **kwargs)

    def __enter__(self) -> KernelClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:  # never shows the token
        return f"KernelClient({self.address!r})"

    def connect(self) -> None:
        if self._sock is not None:
            return
        try:
            sock = connect_socket(self.address, self.connect_timeout_s)
        except (OSError, ValueError) as exc:
            raise KernelConnectionError(
                f"cannot reach the kernel at {self.address}: {exc}"
            ) from exc
        try:
            self._handshake(sock)
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    def _handshake(self, sock: socket.socket) -> None:
        try:
            hello = recv_frame(sock, 4096)
            if not hello or hello.get("type") != "hello" or not isinstance(hello.get("nonce"), str):
                raise KernelProtocolError(f"{self.address} did not greet as a farm kernel")
            client_nonce = auth.new_nonce()
            proof = auth.mac(self._token, "client", hello["nonce"], client_nonce)
            send_frame(sock, {"type": "auth", "nonce": client_nonce, "mac": proof})
            welcome = recv_frame(sock, 4096)
        except (OSError, FrameError) as exc:
            raise KernelConnectionError(f"handshake with {self.address} failed: {exc}") from exc
        if not welcome or welcome.get("type") != "welcome":
            raise KernelAuthError(f"the kernel at {self.address} refused the token")
        if not auth.verify(self._token, "server", hello["nonce"], client_nonce, welcome.get("mac")):
            raise KernelAuthError(f"the peer at {self.address} does not hold the kernel token")
        self.kernel_version = welcome.get("version")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def request(
        self,
        message: Request,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        on_frame: Callable[[dict[str, Any]], protocol.Answer | None] | None = None,
    ) -> dict[str, Any]:
        """Send one request and wait for its final reply (the whole exchange has
        ``timeout_s``); intermediate frames go to ``on_frame``, and a frame it returns is sent
        back (an answer to a host call); raises on error frames. Every frame that comes back
        passes ``check`` first (``KernelProtocolError`` when it refuses one)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self.connect()
            assert self._sock is not None
            try:
                self._sock.settimeout(timeout_s)
                send_frame(self._sock, message)
                while True:
                    reply = recv_frame(self._sock, self.max_frame)
                    if reply is not None and self.check is not None:
                        self._checked(reply)
                    if reply is None or reply["type"] not in INTERMEDIATE:
                        break
                    answer = on_frame(reply) if on_frame is not None else None
                    if answer is not None:
                        send_frame(self._sock, answer)
                    self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
            except (OSError, FrameError) as exc:
                self.close()
                raise KernelConnectionError(f"lost the kernel at {self.address}: {exc}") from exc
            if reply is None:
                self.close()
                raise KernelConnectionError(f"the kernel at {self.address} closed the connection")
        if reply["type"] == "error":
            code = str(reply.get("code"))
            if code not in RECOVERABLE_CODES:
                self.close()  # the kernel closed its end: the next request connects again
            raise KernelRequestError(code, str(reply.get("message")))
        return reply

    def _checked(self, frame: dict[str, Any]) -> None:
        assert self.check is not None
        try:
            self.check(frame)
        except ValueError as exc:
            self.close()  # what follows on this connection cannot be trusted either
            raise KernelProtocolError(
                f"the kernel at {self.address} sent a {frame.get('type')!r} frame outside the "
                f"protocol: {exc}"
            ) from exc

    def _reply(self, reply: dict[str, Any], kind: str, to: str) -> Any:
        if reply.get("type") != kind:
            raise KernelProtocolError(f"unexpected reply to {to}: {reply.get('type')!r}")
        return reply

    def ping(self, timeout_s: float = 5.0) -> protocol.Pong:
        pong: protocol.Pong = self._reply(self.request({"type": "ping"}, timeout_s), "pong", "ping")
        return pong

    def open_session(
        self,
        *,
        tools: bool = True,
        limits: dict[str, int] | None = None,
        session_id: str | None = None,
        egress: bool = False,
        wait_s: float | None = None,
    ) -> protocol.SessionOpened:
        """Open a session (``session_id``: the host's choice); with ``egress`` its box's proxy
        endpoint goes to the attached proxy (``attach_egress``) before this returns. Its box
        waits up to ``wait_s`` for room (the kernel's default when ``None``); then
        ``KernelRequestError`` ``too_many_sessions``."""
        message: protocol.OpenSession = {"type": "open_session", "tools": tools}
        if wait_s is not None:
            message["wait_s"] = wait_s
        if limits:
            message["limits"] = cast(protocol.BoxLimits, limits)
        if session_id:
            message["session_id"] = session_id
        if egress:
            message["egress"] = egress
        budget = DEFAULT_TIMEOUT_S + (wait_s if wait_s is not None else DEFAULT_WAIT_S)
        opened: protocol.SessionOpened = self._reply(
            self.request(message, budget), "session_opened", "open_session"
        )
        return opened

    def attach_egress(self) -> socket.socket:
        """Make this connection the one the kernel hands boxes' proxy endpoints to, and give
        it to the caller (read it with ``framing.recv_frame_fds``); this client is then closed."""
        self._reply(self.request({"type": "egress_attach"}), "egress_attached", "egress_attach")
        if self._sock is None:
            raise KernelProtocolError("the kernel closed the egress connection at once")
        sock, self._sock = self._sock, None
        sock.settimeout(None)
        return sock

    def execute(
        self,
        session_id: str,
        code: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        epoch: int,
        exec_id: str | None = None,
        max_output_bytes: int | None = None,
        grace_s: float = 2.0,
        on_event: Callable[[protocol.CellEvent], dict[str, Any] | None] | None = None,
        calls: list[str] | None = None,
    ) -> protocol.CellResult:
        """Run ``code``; with ``on_event``, the cell's events (``started``, ``stream``,
        ``display``, ``call``) reach it while the code runs, in order, before this returns.
        ``calls`` names the host callbacks the cell may call; for a ``call`` event,
        ``on_event`` returns the answer (``{"ok": True, "value": ...}`` or ``{"ok": False,
        "error": {"ename": ..., "evalue": ...}}``)."""
        message: protocol.Execute = {
            "type": "execute",
            "session_id": session_id,
            "epoch": epoch,
            "code": code,
            "timeout_s": timeout_s,
            "exec_id": exec_id or uuid.uuid4().hex,
        }
        if max_output_bytes is not None:
            message["max_output_bytes"] = max_output_bytes
        if calls:
            message["calls"] = calls
        on_frame = None
        if on_event is not None:
            message["events"] = True

            def on_frame(frame: dict[str, Any]) -> protocol.Answer | None:
                event: protocol.CellEvent = frame["event"]
                answer = on_event(event)
                if answer is None or event["type"] != "call":
                    return None
                reply: protocol.Answer = {
                    "type": "answer",
                    "session_id": session_id,
                    "id": event["id"],
                    **answer,  # type: ignore[typeddict-item]  # ok, and value or error
                }
                return reply

        budget = timeout_s + grace_s + REQUEST_SLACK_S
        done: protocol.ExecReply = self._reply(
            self.request(message, budget, on_frame), "exec_result", "execute"
        )
        if on_event is not None and done.get("started"):  # held back: nothing else was said
            on_event({"type": "started"})
        return done["result"]

    def command(
        self,
        session_id: str,
        argv: list[str],
        *,
        exec_id: str,
        timeout_s: float,
        stdin: bytes | None = None,
        stdin_path: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        max_output_bytes: int | None = None,
        grace_s: float = 2.0,
    ) -> protocol.CommandOutcome:
        """Run ``argv`` in the session's box (``farm.kernel.commands``); the result's fields."""
        message: protocol.Command = {
            "type": "command",
            "session_id": session_id,
            "exec_id": exec_id,
            "argv": argv,
            "timeout_s": timeout_s,
        }
        if stdin:
            message["stdin"] = base64.b64encode(stdin).decode("ascii")
        if stdin_path is not None:
            message["stdin_path"] = stdin_path
        if cwd is not None:
            message["cwd"] = cwd
        if env is not None:
            message["env"] = env
        if max_output_bytes is not None:
            message["max_output_bytes"] = max_output_bytes
        budget = timeout_s + grace_s + REQUEST_SLACK_S
        done: protocol.CommandReply = self._reply(
            self.request(message, budget), "command_result", "command"
        )
        return done["result"]

    def file(
        self, session_id: str, op: protocol.FileOp, path: str, **fields: Any
    ) -> protocol.FileReply:
        """One file operation (``farm.kernel.tools.fileops``): ``result``, or ``error``
        (``ename``, ``evalue``, ``errno``, ``path``); ``fields`` as ``protocol.FileRequest``."""
        message = cast(
            protocol.FileRequest,
            {"type": "file", "session_id": session_id, "op": op, "path": path, **fields},
        )
        done: protocol.FileReply = self._reply(
            self.request(message, FILE_TIMEOUT_S), "file_result", "file"
        )
        return done

    def item(
        self,
        exec_id: str,
        cells: list[str],
        *,
        timeout_s: float,
        session_id: str | None = None,
        limits: dict[str, int] | None = None,
        files: dict[str, bytes] | None = None,
        argv: list[str] | None = None,
        max_output_bytes: int | None = None,
        grace_s: float = 2.0,
        on_event: Callable[[str, protocol.CellEvent], None] | None = None,
        egress: bool = False,
        judge: protocol.JudgeSpec | None = None,
        wait_s: float | None = None,
    ) -> protocol.ItemOutcome:
        """A one-shot box in one round trip (``protocol.Item``): open, write ``files``, run
        ``cells`` (stopping at the first that fails), run ``argv`` or ``judge``, close. With
        ``on_event``, each cell's events reach it with the cell's exec id (``<exec_id>-<n>``).
        Returns the ``ItemOutcome`` dict (``cells``, ``command``, ``judge``, ``file_error``,
        ``session_id``). Its box waits up to ``wait_s`` for room, as ``open_session``'s."""
        message: protocol.Item = {
            "type": "item",
            "exec_id": exec_id,
            "cells": cells,
            "timeout_s": timeout_s,
        }
        if session_id:
            message["session_id"] = session_id
        if limits:
            message["limits"] = cast(protocol.BoxLimits, limits)
        if argv:
            message["argv"] = argv
        if judge:
            message["judge"] = judge
        if egress:
            message["egress"] = egress
        if files:
            encoded = {path: base64.b64encode(data).decode("ascii") for path, data in files.items()}
            message["files"] = encoded
        if max_output_bytes is not None:
            message["max_output_bytes"] = max_output_bytes
        if wait_s is not None:
            message["wait_s"] = wait_s
        on_frame = None
        if on_event is not None:
            message["events"] = True

            def on_frame(frame: dict[str, Any]) -> protocol.Answer | None:
                on_event(frame["exec_id"], frame["event"])
                return None

        steps = len(cells) + (1 if argv or judge else 0)
        budget = steps * (timeout_s + grace_s) + REQUEST_SLACK_S + FILE_TIMEOUT_S * bool(files)
        budget += wait_s if wait_s is not None else DEFAULT_WAIT_S
        done: protocol.ItemReply = self._reply(
            self.request(message, budget, on_frame), "item_result", "item"
        )
        return done["result"]

    def branch(self, message: Branch, timeout_s: float = DEFAULT_TIMEOUT_S) -> Branched:
        """A ``branch`` request (``branch_frames``): checkpoint, rollback, drop or fork."""
        reply: Branched = self._reply(self.request(message, timeout_s), "branched", "branch")
        return reply

    def close_session(self, session_id: str) -> None:
        reply = self.request({"type": "close_session", "session_id": session_id})
        self._reply(reply, "session_closed", "close_session")
