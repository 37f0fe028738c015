"""Every frame of the kernel protocol, defined once (stdlib ``TypedDict``s).

The kernel builds and reads these dicts; on the host side ``farm.models`` validates the same
shapes with pydantic, and ``tests/test_protocol.py`` fails when the two drift apart (it builds
every frame from these definitions and validates it with the models, and the reverse).

Three conversations, from the outside in:

- host <-> supervisor (``HOST_FRAMES``): the handshake (``hello``, ``auth``, ``welcome``), then
  requests (``ping``, ``open_session``, ``execute``, ``close_session``) each answered by one
  final frame (``pong``, ``session_opened``, ``exec_result``, ``session_closed`` or ``error``).
  While an ``execute`` with ``events`` runs, ``event`` frames come first, and the host answers
  a host call (an ``event`` of type ``call``) with an ``answer``;
- supervisor <-> session process (``SESSION_FRAMES``): ``cell`` in, ``cell_done`` out, and on
  the way ``display`` (acked with ``ack``) and ``call`` (answered with ``answer``);
- supervisor <-> zygote: JSON datagrams (``ZygoteRequest``, ``ZygoteReport``).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict, get_args

# Why a run failed: the one place the kinds are written (``farm.models.ErrorKind`` mirrors them).
Kind = Literal[
    "user", "timeout", "oom", "output_limit", "state_lost", "sandbox_lost", "infra", "input"
]
KINDS: tuple[Kind, ...] = get_args(Kind)

# --- values inside frames ----------------------------------------------------------------------


class ValueBundle(TypedDict):
    """A cell's value (or a ``display``): ``text`` for people, ``data`` a MIME bundle."""

    text: str
    data: dict[str, Any]


class CellError(TypedDict):
    ename: str
    evalue: str
    traceback: list[str]
    kind: Kind


class CellResult(TypedDict):
    """The result of one ``execute`` (the host adds ``worker`` and ``sub_calls``)."""

    exec_id: str
    session_id: str
    epoch: int
    status: Literal["ok", "error"]
    stdout: str
    stderr: str
    value: ValueBundle | None
    error: CellError | None
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    cpu_s: float
    max_rss_kb: int
    state_lost: bool


class BoxLimits(TypedDict, total=False):
    """Limits of one box (session); any left out take the kernel's defaults."""

    memory_mb: int  # RLIMIT_DATA of each process: a bigger allocation raises MemoryError
    pids: int  # RLIMIT_NPROC of the box's uid: processes and threads
    fsize_mb: int  # RLIMIT_FSIZE: the largest file a process may write
    nofile: int  # RLIMIT_NOFILE


class CallError(TypedDict):
    ename: str
    evalue: str


# --- events of a running cell (``event`` frames) ----------------------------------------------


class StartedEvent(TypedDict):
    type: Literal["started"]


class RunningEvent(TypedDict):
    type: Literal["running"]


class StreamEvent(TypedDict):
    type: Literal["stream"]
    name: Literal["stdout", "stderr"]
    text: str


class DisplayEvent(TypedDict):
    type: Literal["display"]
    value: ValueBundle


class CallEvent(TypedDict):
    """A host callback the cell made; the host answers with an ``answer`` frame."""

    type: Literal["call"]
    id: int
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    batch: bool


CellEvent = StartedEvent | RunningEvent | StreamEvent | DisplayEvent | CallEvent

# --- host <-> supervisor -----------------------------------------------------------------------


class Hello(TypedDict):
    type: Literal["hello"]
    kernel: Literal["farm"]
    version: str
    nonce: str


class Auth(TypedDict):
    type: Literal["auth"]
    nonce: str
    mac: str


class Welcome(TypedDict):
    type: Literal["welcome"]
    mac: str
    version: str


class ErrorFrame(TypedDict):
    type: Literal["error"]
    code: str
    message: str


class Ping(TypedDict):
    type: Literal["ping"]


class Pong(TypedDict):
    type: Literal["pong"]
    version: str
    python: str
    pid: int
    sessions: int
    max_sessions: int
    uptime_s: float
    grace_s: float
    max_frame: int
    isolation: Literal["uids", "dirs"]
    box_limits: BoxLimits


class OpenSession(TypedDict):
    type: Literal["open_session"]
    tools: NotRequired[bool]
    limits: NotRequired[BoxLimits]


class SessionOpened(TypedDict):
    type: Literal["session_opened"]
    session_id: str
    epoch: int


class Execute(TypedDict):
    type: Literal["execute"]
    session_id: str
    epoch: int
    code: str
    timeout_s: float
    exec_id: str
    max_output_bytes: NotRequired[int]
    events: NotRequired[bool]
    calls: NotRequired[list[str]]


class EventFrame(TypedDict):
    type: Literal["event"]
    exec_id: str
    event: CellEvent


class Answer(TypedDict):
    """The host's answer to a ``call`` event (``ok`` with ``value``, or ``error``)."""

    type: Literal["answer"]
    session_id: str
    id: int
    ok: bool
    value: NotRequired[Any]
    error: NotRequired[CallError]


class ExecReply(TypedDict):
    type: Literal["exec_result"]
    result: CellResult


class CloseSession(TypedDict):
    type: Literal["close_session"]
    session_id: str


class SessionClosed(TypedDict):
    type: Literal["session_closed"]
    session_id: str


class Command(TypedDict):
    """Run ``argv`` in the session's box (``commands``); stdin inline (base64) or staged."""

    type: Literal["command"]
    session_id: str
    exec_id: str
    argv: list[str]
    timeout_s: float
    stdin: NotRequired[str]
    stdin_path: NotRequired[str]
    cwd: NotRequired[str]
    env: NotRequired[dict[str, str]]
    max_output_bytes: NotRequired[int]


class CommandOutcome(TypedDict):
    """What a command did (the host adds ``worker`` and, around it, ``error``)."""

    exec_id: str
    session_id: str
    returncode: int | None  # the exit status, or 128 + N for a death by signal N
    signal: int | None
    timed_out: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float


class CommandReply(TypedDict):
    type: Literal["command_result"]
    result: CommandOutcome


FileOp = Literal["write", "read", "stat", "list", "remove", "extract"]


class FileError(TypedDict):
    ename: str
    evalue: str
    errno: int
    path: str


class FileRequest(TypedDict):
    """One file operation (``fileops``): chunks of ``data`` (base64) written at ``offset``,
    ``length`` bytes read from ``offset``; ``scope`` "workspace" (confined) or "box"."""

    type: Literal["file"]
    session_id: str
    op: FileOp
    path: str
    scope: NotRequired[Literal["workspace", "box"]]
    offset: NotRequired[int]
    length: NotRequired[int]
    data: NotRequired[str]
    source: NotRequired[str]


class FileReply(TypedDict):
    type: Literal["file_result"]
    result: Any
    error: FileError | None


HOST_FRAMES: dict[str, type] = {
    "hello": Hello,
    "auth": Auth,
    "welcome": Welcome,
    "error": ErrorFrame,
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
}

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


class CallFrame(TypedDict):
    type: Literal["call"]
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    batch: NotRequired[bool]


class CallAnswer(TypedDict):
    """The supervisor's answer to a ``call``; ``interrupt``: the cell timed out meanwhile."""

    type: Literal["answer"]
    ok: bool
    value: NotRequired[Any]
    error: NotRequired[CallError]
    interrupt: NotRequired[bool]


class FileDone(TypedDict):
    type: Literal["file_done"]
    result: NotRequired[Any]
    error: NotRequired[FileError]


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


class ZygoteRequest(TypedDict):
    """``spawn`` (``session``) or ``reset`` (``id``, ``box``, ``remove``: also its files,
    ``pgid``)."""

    op: Literal["spawn", "reset"]
    session: NotRequired[SessionConfig]
    box: NotRequired[BoxInfo]
    id: NotRequired[int]
    remove: NotRequired[bool]
    pgid: NotRequired[int | None]


class ZygoteReport(TypedDict):
    """``spawned`` (its fds travel with it), ``exited`` (``code`` or ``signal``) or
    ``reset_done`` (``id``, ``ok``)."""

    op: Literal["spawned", "exited", "reset_done"]
    pid: NotRequired[int]
    code: NotRequired[int | None]
    signal: NotRequired[int]
    id: NotRequired[int]
    ok: NotRequired[bool]
