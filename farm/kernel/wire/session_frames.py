"""The frames between the supervisor and a session process, defined once (stdlib ``TypedDict``s).

On the session's control socket: the session's ``ready``, then ``cell`` in, ``cell_done`` out,
and on the way ``display`` (acked with ``ack``), ``call`` (answered with ``answer``) and ``file``
(``file_done``). Both sides type their code with them: the supervisor (``supervisor.process``)
and the session process (``repl.session``, ``repl.calls``, ``tools.fileops``), which is why they
live in ``wire``, below both. They never leave the sandbox, so no pydantic model mirrors them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict, Union, cast

from .protocol import CallError, CellError, FileError, FileRequest, ValueBundle


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


# Union[...], not ``|``: this module is imported by the kernel under any image's python3 >= 3.9.
Order = Union[CellFrame, FileRequest]  # what a session process reads between cells
FromSession = Union[Ready, CellDone, DisplayFrame, CallFrame, FileDone]

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


def from_session(message: Mapping[str, Any] | None) -> FromSession | None:
    """A frame the supervisor read from a session process, as its type. Typed, not validated:
    user code in the box can write to that socket too (the supervisor branches on the ``type``
    tag; nothing else is checked here)."""
    return cast("FromSession | None", message)
