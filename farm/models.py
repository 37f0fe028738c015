"""Every wire message and result of farm, described once.

The kernel (stdlib only) emits plain dicts; these models are their schema on the host side,
and a test checks that the kernel's dicts validate here. The same models travel to the
caller: ``ExecResult`` is what ``Session.run`` returns.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from farm import kernel


class ErrorKind(StrEnum):
    """Why a run failed; decides retries (only ``infra`` and ``sandbox_lost``, before start).

    The values are the kernel's (``farm.kernel.KINDS``), written there once."""

    USER = kernel.KIND_USER
    TIMEOUT = kernel.KIND_TIMEOUT
    OOM = kernel.KIND_OOM
    OUTPUT_LIMIT = kernel.KIND_OUTPUT_LIMIT
    STATE_LOST = kernel.KIND_STATE_LOST
    SANDBOX_LOST = kernel.KIND_SANDBOX_LOST
    INFRA = kernel.KIND_INFRA
    INPUT = kernel.KIND_INPUT


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Value(_Model):
    """The value of a cell's last expression: ``text`` for people, ``data`` a MIME bundle."""

    text: str
    data: dict[str, Any] = Field(description="MIME bundle; 'text/plain' is always present")


class ExecError(_Model):
    ename: str
    evalue: str
    traceback: list[str] = Field(default_factory=list)
    kind: ErrorKind


class SubCall(_Model):
    """One host callback a run made (``llm_query(...)`` in the sandbox, ``fn`` in the client)."""

    name: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    batch: bool = Field(False, description="a <name>_batched call: args[0] is the list of inputs")
    ok: bool
    response: Any = Field(None, description="what the callback returned (a list when batched)")
    error: str | None = None
    duration_s: float = 0.0
    depth: int = Field(0, description="1 for a call from a top-level session, 2 from a child...")


class CallAnswer(_Model):
    """The client's answer to a host call, as it travels back to the worker."""

    ok: bool
    value: Any = None
    error: dict[str, str] | None = Field(None, description="{'ename': ..., 'evalue': ...}")
    depth: int = 0


class ExecResult(_Model):
    """Everything about one run. ``epoch`` is the session's epoch *after* the call. The
    kernel's part is ``farm.kernel.protocol.CellResult``; the host adds ``HOST_FIELDS``."""

    HOST_FIELDS: ClassVar[frozenset[str]] = frozenset({"worker", "sub_calls"})

    exec_id: str
    session_id: str
    epoch: int
    status: Literal["ok", "error"]
    stdout: str = ""
    stderr: str = ""
    value: Value | None = None
    error: ExecError | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_kb: int = 0
    state_lost: bool = False
    worker: str | None = None
    sub_calls: list[SubCall] = Field(default_factory=list, description="host callbacks made")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def kind(self) -> ErrorKind | None:
        return self.error.kind if self.error else None

    @classmethod
    def failure(
        cls,
        kind: ErrorKind,
        ename: str,
        evalue: str,
        *,
        exec_id: str,
        session_id: str = "",
        epoch: int = 0,
        worker: str | None = None,
        state_lost: bool = False,
    ) -> ExecResult:
        """A result for a run that failed around the code (lost sandbox, infrastructure)."""
        return cls(
            exec_id=exec_id,
            session_id=session_id,
            epoch=epoch,
            status="error",
            error=ExecError(ename=ename, evalue=evalue, kind=kind),
            worker=worker,
            state_lost=state_lost,
        )

    def raise_for_error(self) -> ExecResult:
        """Raise the typed ``farm.errors`` exception for a failed run; return self when ok."""
        if self.error is not None:
            from farm.errors import error_for_result

            raise error_for_result(self)
        return self


class BoxLimits(_Model):
    """Limits of one session's box, within its sandbox's caps; ``None``: the worker's default
    (``FarmSettings.box``). ``memory_mb`` bounds each process's data (a bigger allocation
    raises ``MemoryError``, kind ``oom``), ``pids`` the box's processes and threads,
    ``fsize_mb`` the largest file, ``nofile`` open files."""

    memory_mb: int | None = Field(None, ge=16)
    pids: int | None = Field(None, ge=4)
    fsize_mb: int | None = Field(None, ge=1)
    nofile: int | None = Field(None, ge=16)

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """On the wire a limit left out is absent, not null (the kernel's ``BoxLimits``)."""
        return {k: v for k, v in handler(self).items() if v is not None}


# --- kernel wire messages (host <-> kernel; defined for the kernel in farm.kernel.protocol) ----


class Hello(_Model):
    type: Literal["hello"]
    kernel: Literal["farm"]
    version: str
    nonce: str


class Auth(_Model):
    type: Literal["auth"]
    nonce: str
    mac: str


class Welcome(_Model):
    type: Literal["welcome"]
    mac: str
    version: str


class ErrorReply(_Model):
    type: Literal["error"]
    code: str
    message: str


class Ping(_Model):
    type: Literal["ping"]


class Pong(_Model):
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


class OpenSession(_Model):
    type: Literal["open_session"]
    tools: bool = True
    limits: BoxLimits = Field(default_factory=lambda: BoxLimits())


class SessionOpened(_Model):
    type: Literal["session_opened"]
    session_id: str
    epoch: int


class Execute(_Model):
    type: Literal["execute"]
    session_id: str
    epoch: int
    code: str
    timeout_s: float = Field(gt=0)
    exec_id: str
    max_output_bytes: int = Field(default=1024 * 1024, ge=1024)
    events: bool = Field(False, description="send the cell's events before its result")
    calls: list[str] = Field(default_factory=list, description="host callbacks it may call")


class StartedEvent(_Model):
    type: Literal["started"]


class RunningEvent(_Model):
    type: Literal["running"]


class StreamEvent(_Model):
    type: Literal["stream"]
    name: Literal["stdout", "stderr"]
    text: str


class DisplayEvent(_Model):
    type: Literal["display"]
    value: Value


class CallEvent(_Model):
    type: Literal["call"]
    id: int
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    batch: bool


class EventFrame(_Model):
    """An intermediate frame of an ``execute`` with ``events`` (``farm.events`` holds the typed
    events the worker makes of them)."""

    type: Literal["event"]
    exec_id: str
    event: Annotated[
        StartedEvent | RunningEvent | StreamEvent | DisplayEvent | CallEvent,
        Field(discriminator="type"),
    ]


class Answer(_Model):
    """The host's answer to a ``call`` event."""

    type: Literal["answer"]
    session_id: str
    id: int
    ok: bool
    value: Any = None
    error: dict[str, str] | None = Field(None, description="{'ename': ..., 'evalue': ...}")


class ExecReply(_Model):
    type: Literal["exec_result"]
    result: ExecResult


class CloseSession(_Model):
    type: Literal["close_session"]
    session_id: str


class SessionClosed(_Model):
    type: Literal["session_closed"]
    session_id: str


KERNEL_FRAMES: dict[str, type[_Model]] = {
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
}

# --- worker task replies ------------------------------------------------------------------------


class Opened(_Model):
    """A worker opened a session (the reply of ``farm.open_session``)."""

    session_id: str
    epoch: int
    worker: str
    generation: int
    queue: str


class Refused(_Model):
    """A worker will not open this session anywhere (limits over its sandbox's caps); the
    client raises ``InvalidRequest`` instead of asking again."""

    refused: Literal[True] = True
    worker: str | None = None
    reason: str


class Busy(_Model):
    """A worker could not take the request now; the client asks again (elsewhere)."""

    busy: Literal[True] = True
    worker: str | None = None
    reason: str


# --- sandboxes ------------------------------------------------------------------------------


class SandboxInfo(_Model):
    """What a sandbox is, for ``farm status``, result manifests and audits."""

    backend: str
    isolated: bool
    address: str
    container_id: str | None = None
    image: str | None = None
    image_digest: str | None = None
    limits: dict[str, Any] = Field(default_factory=dict)
    kernel_version: str | None = None
    started_at: float | None = None
    restarts: int = 0


class SandboxHealth(_Model):
    ok: bool
    detail: str = ""
    rtt_s: float | None = None


# --- restore --------------------------------------------------------------------------------


class ReplayedCell(_Model):
    exec_id: str = Field(description="the run this replays (in the journal)")
    replay_exec_id: str = Field(description="the run that replayed it")
    code: str


class RestoreReport(_Model):
    """What ``on_state_lost="replay"`` did after a state loss: exactly which cells it re-ran.

    Replaying re-runs code: effects outside the session's namespace (files written elsewhere,
    network calls, anything the cells did to the world) may happen again.
    """

    session_id: str
    lost_exec_id: str = Field(description="the run whose result reported the loss")
    reason: str
    replayed: list[ReplayedCell] = Field(default_factory=list)
    reran_lost_call: bool = Field(
        False, description="the lost call had run nothing, so it was run again after the replay"
    )
    warning: str = (
        "replayed cells ran again: side effects outside the session (files, network, "
        "external services) may have been repeated"
    )
