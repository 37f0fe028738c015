"""The frames that never leave the sandbox, defined once (stdlib ``TypedDict``s):

- supervisor <-> session process (``SESSION_FRAMES``, on the session's control socket): the
  session's ``ready``, then ``cell`` in, ``cell_done`` out, and on the way ``display`` (acked
  with ``ack``), ``call`` (answered with ``answer``) and ``file`` (``file_done``);
- supervisor <-> zygote (and each box's pid 1, a zygote too): JSON datagrams
  (``ZygoteRequest``, ``ZygoteReport``), sent and read here (``send_request``, ``read_request``).

The host never sees them, so no pydantic model mirrors them; the frames the host does see are
in ``farm.kernel.protocol``.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Literal, TypedDict

from ..wire.protocol import BoxLimits, CallError, CellError, FileError, FileRequest, ValueBundle

# --- supervisor <-> session process -----------------------------------------------------------


class Ready(TypedDict):
    """The session process's first frame: it entered its box and waits for cells."""

    type: Literal["ready"]


class CellFrame(TypedDict):
    type: Literal["cell"]
    code: str
    calls: list[str]


class CellDone(TypedDict):
    type: Literal["cell_done"]
    value: ValueBundle | None
    error: CellError | None
    duration_s: float
    cpu_s: float
    max_rss_kb: int


class DisplayFrame(TypedDict):
    type: Literal["display"]
    value: ValueBundle


class Ack(TypedDict):
    type: Literal["ack"]


class _CallFrameRequired(TypedDict):
    type: Literal["call"]
    name: str
    args: list[Any]
    kwargs: dict[str, Any]


class CallFrame(_CallFrameRequired, total=False):
    batch: bool


class _CallAnswerRequired(TypedDict):
    type: Literal["answer"]
    ok: bool


class CallAnswer(_CallAnswerRequired, total=False):
    """The supervisor's answer to a ``call``; ``interrupt``: the cell timed out meanwhile."""

    value: Any
    error: CallError
    interrupt: bool


class _FileDoneRequired(TypedDict):
    type: Literal["file_done"]


class FileDone(_FileDoneRequired, total=False):
    result: Any
    error: FileError


SESSION_FRAMES: dict[str, type] = {
    "ready": Ready,
    "cell": CellFrame,
    "cell_done": CellDone,
    "display": DisplayFrame,
    "ack": Ack,
    "call": CallFrame,
    "answer": CallAnswer,
    "file": FileRequest,
    "file_done": FileDone,
}

# --- supervisor <-> zygote (datagrams) ---------------------------------------------------------


class BoxInfo(TypedDict):
    """A box as the zygote's children need it (``boxes.Box``)."""

    number: int
    uid: int
    gid: int
    workspace: str
    tmp: str
    limits: BoxLimits


class SessionConfig(TypedDict):
    """What a new session process is told: its box and its tools."""

    tools: bool
    tool_limit: int
    box: BoxInfo


class _ZygoteRequestRequired(TypedDict):
    op: Literal["box", "spawn", "command", "reset"]


class ZygoteRequest(_ZygoteRequestRequired, total=False):
    """``box`` (make one: ``box``), ``spawn`` (``session``), ``command`` (``box``, argv...) or
    ``reset`` (``id``; to the zygote with uid boxes also ``box``, ``remove``: its files too,
    ``pgid``)."""

    session: SessionConfig
    box: BoxInfo
    id: int
    remove: bool
    pgid: int | None


class _ZygoteReportRequired(TypedDict):
    op: Literal["spawned", "exited", "reset_done"]


class ZygoteReport(_ZygoteReportRequired, total=False):
    """``spawned`` (its fds travel with it), ``exited`` (``code`` or ``signal``) or
    ``reset_done`` (``id``, ``ok``)."""

    pid: int
    code: int | None
    signal: int
    id: int
    ok: bool


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds or [])


INLINE_MAX = 32 * 1024  # a request larger than this travels in a memfd (argv, env of a command)
_RECV_MAX = 64 * 1024


def send_request(sock: socket.socket, message: dict[str, Any]) -> None:
    """The supervisor's side: one datagram, or, for a request too large for one (a command's
    argv or env may be megabytes), a small datagram carrying a memfd that holds it."""
    data = json.dumps(message).encode()
    if len(data) <= INLINE_MAX:
        sock.send(data)
        return
    fd = os.memfd_create("farm-request", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        socket.send_fds(sock, [json.dumps({"op": message["op"], "in_fd": True}).encode()], [fd])
    finally:
        os.close(fd)


def read_request(sock: socket.socket) -> dict[str, Any] | None:
    """The zygote's side: the next request, ``{}`` for one it cannot read (the supervisor
    never sends those; the zygote must never die of one), ``None`` at the supervisor's end."""
    data, fds, flags, _ = socket.recv_fds(sock, _RECV_MAX, 1)
    if not data and not fds:
        return None
    try:
        if flags & socket.MSG_TRUNC:
            return {}
        message = json.loads(data)
        if message.get("in_fd") and fds:
            os.lseek(fds[0], 0, os.SEEK_SET)
            chunks = []
            while True:
                chunk = os.read(fds[0], 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
            message = json.loads(b"".join(chunks))
        return message if isinstance(message, dict) else {}
    except (ValueError, OSError):
        return {}
    finally:
        for fd in fds:
            os.close(fd)
