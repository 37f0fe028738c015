"""The kernel's frames as the host validates them (defined for the kernel, stdlib only, in
``farm.kernel.wire.protocol``; ``tests/test_protocol.py`` keeps the two in step), and the worker's
replies to a session open."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
)

from farm.models.base import Model
from farm.models.judge import JudgeResult, JudgeSpec
from farm.models.results import BoxLimits, CommandResult, ExecResult, Value

# --- kernel wire messages (host <-> kernel; the kernel's own: farm.kernel.wire.protocol) ----


class Hello(Model):
    type: Literal["hello"]
    kernel: Literal["farm"]
    version: str
    nonce: str


class Auth(Model):
    type: Literal["auth"]
    nonce: str
    mac: str


class Welcome(Model):
    type: Literal["welcome"]
    mac: str
    version: str


class ErrorReply(Model):
    type: Literal["error"]
    code: str
    message: str


class Ping(Model):
    type: Literal["ping"]


class Pong(Model):
    type: Literal["pong"]
    version: str
    python: str
    pid: int
    sessions: int
    max_sessions: int
    uptime_s: float
    grace_s: float
    max_frame: int
    isolation: Literal["namespaces", "uids", "dirs"]
    isolation_fallback: str | None = Field(
        None, description="why boxes have no namespaces although asked to"
    )
    box_limits: BoxLimits
    opens: int = Field(description="sessions opened so far")
    spare_opens: int = Field(description="of which took a process made ahead of time")
    spares: int = Field(description="such processes ready now")
    quarantined: int = Field(description="boxes out of use until a reset of them succeeds")


class OpenSession(Model):
    type: Literal["open_session"]
    tools: bool = True
    limits: BoxLimits = Field(default_factory=lambda: BoxLimits())
    session_id: str | None = None
    egress: bool = False


class SessionOpened(Model):
    type: Literal["session_opened"]
    session_id: str
    epoch: int


class Execute(Model):
    type: Literal["execute"]
    session_id: str
    epoch: int
    code: str
    timeout_s: float = Field(gt=0)
    exec_id: str
    max_output_bytes: int = Field(default=1024 * 1024, ge=1024)
    events: bool = Field(default=False, description="send the cell's events before its result")
    calls: list[str] = Field(default_factory=list, description="host callbacks it may call")


class StartedEvent(Model):
    type: Literal["started"]


class RunningEvent(Model):
    type: Literal["running"]


class StreamEvent(Model):
    type: Literal["stream"]
    name: Literal["stdout", "stderr"]
    text: str


class DisplayEvent(Model):
    type: Literal["display"]
    value: Value


class CallEvent(Model):
    type: Literal["call"]
    id: int
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    batch: bool


class DoneEvent(Model):
    type: Literal["done"]
    result: ExecResult


class EventFrame(Model):
    """An intermediate frame of an ``execute`` with ``events`` (``farm.events`` holds the typed
    events the worker makes of them)."""

    type: Literal["event"]
    exec_id: str
    event: Annotated[
        StartedEvent | RunningEvent | StreamEvent | DisplayEvent | CallEvent | DoneEvent,
        Field(discriminator="type"),
    ]


class Answer(Model):
    """The host's answer to a ``call`` event."""

    type: Literal["answer"]
    session_id: str
    id: int
    ok: bool
    value: Any = None
    error: dict[str, str] | None = Field(default=None, description="{'ename': ..., 'evalue': ...}")


class ExecReply(Model):
    type: Literal["exec_result"]
    result: ExecResult


class CloseSession(Model):
    type: Literal["close_session"]
    session_id: str


class SessionClosed(Model):
    type: Literal["session_closed"]
    session_id: str


class Command(Model):
    type: Literal["command"]
    session_id: str
    exec_id: str
    argv: list[str] = Field(min_length=1)
    timeout_s: float = Field(gt=0)
    stdin: str | None = Field(default=None, description="base64")
    stdin_path: str | None = None
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    max_output_bytes: int = Field(default=1024 * 1024, ge=1024)


class CommandReply(Model):
    type: Literal["command_result"]
    result: CommandResult


class FileRequest(Model):
    type: Literal["file"]
    session_id: str
    op: Literal["write", "read", "stat", "list", "remove", "extract"]
    path: str
    scope: Literal["workspace", "box"] = "workspace"
    offset: int = Field(default=0, ge=0)
    length: int | None = Field(default=None, ge=0)
    data: str | None = None
    source: str | None = None


class FileError(Model):
    ename: str
    evalue: str
    errno: int
    path: str


class FileReply(Model):
    type: Literal["file_result"]
    result: Any = None
    error: FileError | None = None


class Item(Model):
    """A one-shot box in one request (``farm.kernel.wire.protocol.Item``): the worker's way to run a
    batch item."""

    type: Literal["item"]
    exec_id: str
    cells: list[str]
    timeout_s: float = Field(gt=0)
    session_id: str | None = None
    tools: bool = True
    limits: BoxLimits = Field(default_factory=lambda: BoxLimits())
    files: dict[str, str] = Field(default_factory=dict, description="path -> base64")
    argv: list[str] | None = None
    max_output_bytes: int = Field(default=1024 * 1024, ge=1024)
    events: bool = False
    egress: bool = False
    judge: JudgeSpec | None = None


class ItemOutcome(Model):
    session_id: str
    cells: list[ExecResult]
    command: CommandResult | None = None
    file_error: FileError | None = None
    judge: JudgeResult | None = None


class ItemReply(Model):
    type: Literal["item_result"]
    result: ItemOutcome


KERNEL_FRAMES: dict[str, type[Model]] = {
    "hello": Hello,
    "auth": Auth,
    "welcome": Welcome,
    "error": ErrorReply,
    "ping": Ping,
    "pong": Pong,
    "open_session": OpenSession,
    "session_opened": SessionOpened,
    "execute": Execute,
    "event": EventFrame,
    "answer": Answer,
    "exec_result": ExecReply,
    "close_session": CloseSession,
    "session_closed": SessionClosed,
    "command": Command,
    "command_result": CommandReply,
    "file": FileRequest,
    "file_result": FileReply,
    "item": Item,
    "item_result": ItemReply,
}

# --- worker task replies ------------------------------------------------------------------------


class Opened(Model):
    """A worker opened a session (the reply of ``farm.open_session``)."""

    session_id: str
    epoch: int
    worker: str
    generation: int
    queue: str


class Refused(Model):
    """A worker will not open this session anywhere (limits over its sandbox's caps); the
    client raises ``InvalidRequest`` instead of asking again."""

    refused: Literal[True] = True
    worker: str | None = None
    reason: str


class Busy(Model):
    """A worker could not take the request now; the client asks again (elsewhere)."""

    busy: Literal[True] = True
    worker: str | None = None
    reason: str
