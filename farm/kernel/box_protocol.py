"""The frames that never leave the sandbox, defined once (stdlib ``TypedDict``s):

- supervisor <-> session process (``SESSION_FRAMES``, on the session's control socket): the
  session's ``ready``, then ``cell`` in, ``cell_done`` out, and on the way ``display`` (acked
  with ``ack``), ``call`` (answered with ``answer``) and ``file`` (``file_done``);
- supervisor <-> zygote: JSON datagrams (``ZygoteRequest``, ``ZygoteReport``).

The host never sees them, so no pydantic model mirrors them; the frames the host does see are
in ``farm.kernel.protocol``.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from .protocol import BoxLimits, CallError, CellError, FileError, FileRequest, ValueBundle

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
    op: Literal["spawn", "reset"]


class ZygoteRequest(_ZygoteRequestRequired, total=False):
    """``spawn`` (``session``) or ``reset`` (``id``, ``box``, ``remove``: also its files,
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
