"""The supervisor <-> zygote datagrams, defined once (stdlib ``TypedDict``s).

The supervisor talks to the zygote (and each box's pid 1, a zygote too) in JSON datagrams: a
request per ``op`` (``ZygoteRequest``) and a report per ``op`` (``ZygoteReport``), sent and read
here. The host never sees them, so no pydantic model mirrors them; the frames the host does see
are in ``wire.protocol``, and those between the supervisor and a session process (which the
session side types too, below ``boxes``) in ``wire.session_frames``.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Literal, TypedDict, Union

from ..wire.protocol import BoxLimits, JudgeSpec

# --- supervisor <-> zygote (datagrams) ---------------------------------------------------------


class BoxInfo(TypedDict):
    """A box as the zygote's children need it (``pool.Box.describe``)."""

    number: int
    uid: int
    gid: int
    workspace: str
    tmp: str
    limits: BoxLimits
    env: dict[str, str]  # variables of its own for its processes (its proxy's, with egress)


class SessionConfig(TypedDict):
    """What a new session process is told: its box and its tools."""

    tools: bool
    tool_limit: int
    box: BoxInfo


class MakeBox(TypedDict):
    """To the sandbox's zygote (``namespaces``): make a box; ``spawned`` says its pid 1."""

    op: Literal["box"]
    box: BoxInfo


class Spawn(TypedDict):
    """Start a session process; ``spawned`` carries its control socket and output pipes."""

    op: Literal["spawn"]
    session: SessionConfig


class StartCommand(TypedDict):
    """Start a command under its keeper, or with ``judge`` a judge's runner; ``spawned``
    carries its stdin and output pipes."""

    op: Literal["command"]
    box: BoxInfo
    argv: list[str]
    cwd: str | None
    env: dict[str, str] | None
    stdin_path: str | None
    judge: JudgeSpec | None


class _ResetRequired(TypedDict):
    op: Literal["reset"]
    id: int


class Reset(_ResetRequired, total=False):
    """Kill every process of a box; ``reset_done`` answers. To a box's pid 1 nothing more; to
    the zygote with uid boxes the ``box``, whether to ``remove`` its files, and the session
    process's ``pgid`` (a helper does it, as the box's uid)."""

    box: BoxInfo
    remove: bool
    pgid: int | None


class Recycle(TypedDict):
    """To a box's pid 1 as the box ends: empty it for its number's next box (``reset_done``)."""

    op: Literal["recycle"]
    id: int
    box: BoxInfo


class Listen(TypedDict):
    """To a box's pid 1: a proxy endpoint in the box's network (``listening``)."""

    op: Literal["listen"]
    id: int


ZygoteRequest = Union[MakeBox, Spawn, StartCommand, Reset, Recycle, Listen]


class _SpawnedRequired(TypedDict):
    op: Literal["spawned"]
    pid: int  # -1: nothing was started (``error`` says why)


class Spawned(_SpawnedRequired, total=False):
    """A process started (its fds travel with it; from a box's pid 1, its pidfd last)."""

    error: str


class _ExitedRequired(TypedDict):
    op: Literal["exited"]
    pid: int


class Exited(_ExitedRequired, total=False):
    """A child reaped: its exit ``code`` (``None``: not known), or the ``signal`` that
    killed it."""

    code: int | None
    signal: int


class ResetDone(TypedDict):
    """The answer to a ``reset`` or ``recycle``: whether the box is as it should be."""

    op: Literal["reset_done"]
    id: int
    ok: bool


class _ListeningRequired(TypedDict):
    op: Literal["listening"]
    id: int


class Listening(_ListeningRequired, total=False):
    """A box's proxy endpoint (its listening socket travels with it), or why there is none."""

    port: int
    error: str


ZygoteReport = Union[Spawned, Exited, ResetDone, Listening]


class _InFd(TypedDict):
    """The datagram that stands for a request too large for one: the request is in its fd."""

    op: str
    in_fd: Literal[True]


class UnreadableRequest(Exception):
    """A datagram the zygote cannot read (the supervisor never sends one)."""


def refusal(request: ZygoteRequest, why: str) -> ZygoteReport:
    """The report that answers ``request`` when it could start nothing (a fork refused)."""
    if request["op"] == "reset" or request["op"] == "recycle":
        return {"op": "reset_done", "id": request["id"], "ok": False}
    if request["op"] == "listen":
        return {"op": "listening", "id": request["id"], "error": why}
    return {"op": "spawned", "pid": -1, "error": why}


def send(sock: socket.socket, report: ZygoteReport, fds: list[int] | None = None) -> None:
    """The zygote's side: one report, with the fds it carries."""
    socket.send_fds(sock, [json.dumps(report).encode()], fds or [])


INLINE_MAX = 32 * 1024  # a request larger than this travels in a memfd (argv, env of a command)
_RECV_MAX = 64 * 1024


def send_request(sock: socket.socket, request: ZygoteRequest) -> None:
    """The supervisor's side: one datagram, or, for a request too large for one (a command's
    argv or env may be megabytes), a small datagram carrying a memfd that holds it."""
    data = json.dumps(request).encode()
    if len(data) <= INLINE_MAX:
        sock.send(data)
        return
    fd = os.memfd_create("farm-request", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        in_fd: _InFd = {"op": request["op"], "in_fd": True}
        socket.send_fds(sock, [json.dumps(in_fd).encode()], [fd])
    finally:
        os.close(fd)


def read_request(sock: socket.socket) -> ZygoteRequest | None:
    """The zygote's side: the next request, ``None`` at the supervisor's end; one it cannot
    read raises ``UnreadableRequest`` (the supervisor never sends those; the zygote must never
    die of one)."""
    data, fds, flags, _ = socket.recv_fds(sock, _RECV_MAX, 1)
    if not data and not fds:
        return None
    try:
        if flags & socket.MSG_TRUNC:
            raise UnreadableRequest("a datagram too large")
        message = json.loads(data)
        if not isinstance(message, dict):
            raise UnreadableRequest("not a JSON object")
        if message.get("in_fd") and fds:
            os.lseek(fds[0], 0, os.SEEK_SET)
            chunks = []
            while True:
                chunk = os.read(fds[0], 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
            message = json.loads(b"".join(chunks))
        request: ZygoteRequest = message  # the supervisor's, its only peer
        if isinstance(message, dict):
            return request
        raise UnreadableRequest("not a JSON object")
    except (ValueError, OSError) as exc:
        raise UnreadableRequest(str(exc)) from None
    finally:
        for fd in fds:
            os.close(fd)
