"""The frames between the supervisor and a session process, defined once (stdlib ``TypedDict``s).

On the session's control socket: the session's ``ready``, then ``cell`` in, ``cell_done`` out,
and on the way ``display`` (acked with ``ack``), ``call`` (answered with ``answer``) and ``file``
(``file_done``). Both sides type their code with them: the supervisor
(``supervisor.session_process``) and the session process (``repl.session_loop``,
``repl.hostcall_stubs``, ``tools.fileops``), which is why they live in ``wire``, below both.
They never leave the sandbox, so no pydantic model mirrors them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict, Union, cast, get_args

from .framing import FrameError
from .protocol import CallError, CellError, FileError, FileRequest, Kind, ValueBundle

KINDS = frozenset(get_args(Kind))


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
    blob: bytes  # a read's bytes (raw after the JSON, ``framing``)


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


class MalformedFrame(FrameError):
    """A session process sent a frame outside this protocol (user code in the box can write
    to its control socket too)."""


def from_session(message: Mapping[str, Any] | None) -> FromSession | None:
    """A frame the supervisor read from a session process, checked where the supervisor passes
    its fields on to the host (a value, an error, a call), else ``MalformedFrame``; a frame of
    an unknown type passes (the supervisor logs and skips it)."""
    if message is None:
        return None
    check = _CHECKS.get(message.get("type"))
    problem = check(message) if check is not None else None
    if problem is not None:
        raise MalformedFrame(f"a {message.get('type')!r} frame with {problem}")
    return cast("FromSession", message)


def _bundle(value: Any) -> str | None:
    if not isinstance(value, dict) or set(value) != {"text", "data"}:
        return "a value that is not {text, data}"
    if not isinstance(value["text"], str) or not isinstance(value["data"], dict):
        return "a value of the wrong types"
    return None


def _error(error: Any) -> str | None:
    if not isinstance(error, dict) or set(error) != {"ename", "evalue", "traceback", "kind"}:
        return "an error that is not {ename, evalue, traceback, kind}"
    texts = (error["ename"], error["evalue"], *_list(error["traceback"]))
    if not all(isinstance(t, str) for t in texts) or error["kind"] not in KINDS:
        return "an error of the wrong types"
    return None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [None]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell_done(frame: Mapping[str, Any]) -> str | None:
    if frame.get("value") is not None and _bundle(frame["value"]):
        return _bundle(frame["value"])
    if frame.get("error") is not None and _error(frame["error"]):
        return _error(frame["error"])
    if not all(_number(frame.get(k)) for k in ("duration_s", "cpu_s", "max_rss_kb")):
        return "measurements that are not numbers"
    return None


def _call(frame: Mapping[str, Any]) -> str | None:
    shapes = (("name", str), ("args", list), ("kwargs", dict), ("batch", bool))
    if any(not isinstance(frame.get(k, False), t) for k, t in shapes):
        return "fields of the wrong types"
    return None


def _file_done(frame: Mapping[str, Any]) -> str | None:
    error = frame.get("error")
    if error is not None and (
        not isinstance(error, dict) or set(error) != {"ename", "evalue", "errno", "path"}
    ):
        return "an error that is not {ename, evalue, errno, path}"
    if "blob" in frame and not isinstance(frame["blob"], bytes):
        return "a blob that is not bytes"
    return None


_CHECKS: dict[Any, Callable[[Mapping[str, Any]], str | None]] = {
    "ready": lambda frame: None,
    "cell_done": _cell_done,
    "display": lambda frame: _bundle(frame.get("value")),
    "call": _call,
    "file_done": _file_done,
}
