"""What a run produces, as the caller holds it: ``ExecResult`` and its parts, the failure kinds,
a session's box limits, what a restore re-ran, and the exceptions a failed run raises (they
carry the result and the result raises them, so they live together; users import them from
``farm.errors``)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from farm import kernel
from farm.kernel.wire.protocol import CommandOutcome
from farm.kernel.wire.wire_errors import FarmError
from farm.models.model_base import Model


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


class Value(Model):
    """The value of a cell's last expression: ``text`` for people, ``data`` a MIME bundle."""

    text: str
    data: dict[str, Any] = Field(description="MIME bundle; 'text/plain' is always present")


class ExecError(Model):
    ename: str
    evalue: str
    traceback: list[str] = Field(default_factory=list)
    kind: ErrorKind


class SubCall(Model):
    """One host callback a run made (``llm_query(...)`` in the sandbox, ``fn`` in the client)."""

    name: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    batch: bool = Field(
        default=False, description="a <name>_batched call: args[0] is the list of inputs"
    )
    ok: bool
    response: Any = Field(
        default=None, description="what the callback returned (a list when batched)"
    )
    error: str | None = None
    duration_s: float = 0.0
    depth: int = Field(
        default=0, description="1 for a call from a top-level session, 2 from a child..."
    )


class CallAnswer(Model):
    """The client's answer to a host call, as it travels back to the worker."""

    ok: bool
    value: Any = None
    error: dict[str, str] | None = Field(default=None, description="{'ename': ..., 'evalue': ...}")
    depth: int = 0


class ExecResult(Model):
    """Everything about one run. ``epoch`` is the session's epoch *after* the call. The
    kernel's part is ``farm.kernel.wire.protocol.CellResult``; the host adds ``HOST_FIELDS``."""

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
            raise error_for_result(self)
        return self


class BoxLimits(Model):
    """Limits of one session's box, within its sandbox's caps; ``None``: the worker's default
    (``FarmSettings.box``). ``memory_mb`` bounds each process's data (a bigger allocation
    raises ``MemoryError``, kind ``oom``), ``pids`` the box's processes and threads,
    ``fsize_mb`` the largest file, ``nofile`` open files, ``disk_mb`` the box's private disk
    (``/workspace``, ``/tmp``, ``/var/tmp`` and ``/dev/shm`` together)."""

    memory_mb: int | None = Field(default=None, ge=16)
    pids: int | None = Field(default=None, ge=4)
    fsize_mb: int | None = Field(default=None, ge=1)
    nofile: int | None = Field(default=None, ge=16)
    disk_mb: int | None = Field(default=None, ge=1)

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """On the wire a limit left out is absent, not null (the kernel's ``BoxLimits``)."""
        return {k: v for k, v in handler(self).items() if v is not None}


class ReplayedCell(Model):
    exec_id: str = Field(description="the run this replays (in the journal)")
    replay_exec_id: str = Field(description="the run that replayed it")
    code: str


class RestoreReport(Model):
    """What ``on_state_lost="replay"`` did after a state loss: exactly which cells it re-ran.

    Replaying re-runs code: effects outside the session's namespace (files written elsewhere,
    network calls, anything the cells did to the world) may happen again.
    """

    session_id: str
    lost_exec_id: str = Field(description="the run whose result reported the loss")
    reason: str
    replayed: list[ReplayedCell] = Field(default_factory=list)
    reran_lost_call: bool = Field(
        default=False,
        description="the lost call had run nothing, so it was run again after the replay",
    )
    warning: str = (
        "replayed cells ran again: side effects outside the session (files, network, "
        "external services) may have been repeated"
    )


class CommandResult(Model):
    """Everything about one command (``session.exec``): its exit, its outputs (capped like a
    cell's), and ``error`` when something around it failed (``timeout``, ``sandbox_lost``,
    ``input``...). The kernel's part is ``farm.kernel.wire.protocol.CommandOutcome``."""

    HOST_FIELDS: ClassVar[frozenset[str]] = frozenset({"worker", "error"})

    exec_id: str
    session_id: str
    returncode: int | None = Field(
        default=None,
        description="the exit status, or 128 + N for a death by signal N (as shells say)",
    )
    signal: int | None = None
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    worker: str | None = None
    error: ExecError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0

    @classmethod
    def from_kernel(cls, raw: CommandOutcome, worker: str, timeout_s: float) -> CommandResult:
        """The kernel's outcome, completed: a command the timeout killed is kind ``timeout``."""
        result = cls.model_validate({**raw, "worker": worker})
        if result.timed_out:
            why = f"the command ran past its {timeout_s:g}s timeout and was killed (group)"
            result.error = ExecError(ename="TimeoutError", evalue=why, kind=ErrorKind.TIMEOUT)
        return result

    @property
    def kind(self) -> ErrorKind | None:
        """``error``'s kind; ``user`` for a command that exited with a non-zero status."""
        if self.error is not None:
            return self.error.kind
        return ErrorKind.USER if self.returncode != 0 else None


# --- the exceptions a failed run raises (re-exported by ``farm.errors``) -------------------


class ExecFailed(FarmError):
    """A run ended in an error; ``result`` holds everything about it."""

    def __init__(self, result: ExecResult) -> None:
        error = result.error
        summary = f"{error.ename}: {error.evalue}" if error else "unknown error"
        kind = error.kind.value if error else "?"
        super().__init__(f"run {result.exec_id} failed ({kind}): {summary}")
        self.result = result


class UserCodeError(ExecFailed):
    """The code raised (kind ``user``)."""


class ExecTimeout(ExecFailed):
    """The code ran past its timeout (kind ``timeout``)."""


class OutOfMemory(ExecFailed):
    """The code ran out of memory (kind ``oom``)."""


class OutputLimitExceeded(ExecFailed):
    """The code printed far more than the output cap (kind ``output_limit``)."""


class StateLost(ExecFailed):
    """The session's variables are gone; re-run its setup in the new epoch or open a new one."""


class InfraError(ExecFailed):
    """The farm failed around the code (kind ``infra``); safe to retry if it never started."""


class BadInput(ExecFailed):
    """The request itself was refused (kind ``input``: too large, malformed); nothing ran and
    nothing is retried."""


class RestoreFailed(StateLost):
    """``on_state_lost="replay"`` could not rebuild the namespace (a replayed cell failed, or
    the journal no longer holds the whole history); ``report`` says what was re-run."""

    def __init__(self, result: ExecResult, why: str, report: object = None) -> None:
        super().__init__(result)
        self.args = (f"{self.args[0]}; restore failed: {why}",)
        self.why = why
        self.report = report


class SessionLost(FarmError):
    """The session's sandbox or worker is gone (kind ``sandbox_lost``)."""

    def __init__(self, session_id: str | None, worker: str | None, reason: str) -> None:
        what = f"session {session_id}" if session_id else "the run"
        where = f" on worker {worker}" if worker else ""
        super().__init__(f"{what}{where} is lost: {reason}")
        self.session_id = session_id
        self.worker = worker
        self.reason = reason


def error_for_result(result: ExecResult) -> FarmError:
    """The exception that ``ExecResult.raise_for_error`` raises for a failed result."""
    assert result.error is not None
    by_kind: dict[ErrorKind, type[ExecFailed]] = {
        ErrorKind.USER: UserCodeError,
        ErrorKind.TIMEOUT: ExecTimeout,
        ErrorKind.OOM: OutOfMemory,
        ErrorKind.OUTPUT_LIMIT: OutputLimitExceeded,
        ErrorKind.STATE_LOST: StateLost,
        ErrorKind.INFRA: InfraError,
        ErrorKind.INPUT: BadInput,
    }
    if result.error.kind == ErrorKind.SANDBOX_LOST:
        return SessionLost(result.session_id, result.worker, result.error.evalue)
    return by_kind[result.error.kind](result)
