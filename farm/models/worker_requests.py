"""What a client asks of a worker, one model per request: the client sends
``model.model_dump(mode="json")``, the worker checks it on arrival (``arrived``) and reads typed
fields. Closed and strict (an unknown field, a missing one or a wrong type is refused): a
malformed or drifted request is an ``input`` refusal naming the field, never a traceback.
Requests and their tasks: docs/design/control-plane.md. To add one: a ``WorkerRequest`` here,
its task name in ``farm.celeryconf``, a task in ``farm.worker.tasks`` that hands its argument to
a worker method opening with ``arrived(Model, raw)`` (``Malformed``: answer the refusal), the
client's send of the model's dump, a row in the design doc's table, a round trip in
tests/test_worker_requests.py.
"""

from __future__ import annotations

import base64
from typing import Any, Literal, TypeVar

from pydantic import ConfigDict, Field, ValidationError, field_validator

from farm.kernel.wire.protocol import FileOp
from farm.models.model_base import Model

FileScope = Literal["workspace", "box"]
MAX_NAMED = 5  # a refusal names this many faults at most (a request may have thousands)


class WorkerRequest(Model):
    """A request to a worker: unknown fields refused (``Model``), and no coercion either."""

    model_config = ConfigDict(strict=True)


class CellRequest(WorkerRequest):
    """What a cell's run carries, in a session (``ExecRequest``) or a box of its own
    (``RunRequest``). ``exec_id`` is claimed before the code runs: a copy never runs twice."""

    exec_id: str
    code: str
    timeout_s: float
    max_output_bytes: int | None = None


class ExecRequest(CellRequest):
    """A cell in an open session (``farm.exec``), sent to its worker generation's queue."""

    session_id: str
    epoch: int = Field(description="the namespace's epoch it expects: an older one is lost")
    generation: int = Field(description="the worker generation it was sent to")
    stream: bool = Field(default=False, description="publish its events to the run's stream")
    replay_of: str | None = Field(default=None, description="the run it replays (a restore)")
    calls: list[str] | None = Field(default=None, description="host callbacks it may call")
    rollback_to: str | None = Field(
        default=None, description="a checkpoint to roll back to (kept) before the run"
    )


class RunRequest(CellRequest):
    """A one-shot run in a fresh box (``farm.run``), sent to its image's shared queue."""

    limits: dict[str, int] | None = None
    egress: list[str] | None = None
    wait_s: float | None = Field(default=None, description="how long it may wait for room")

    def in_session(self, session_id: str, epoch: int, generation: int) -> ExecRequest:
        """The run as a cell of the session opened for it."""
        cell = self.model_dump(include=set(CellRequest.model_fields))
        return ExecRequest(**cell, session_id=session_id, epoch=epoch, generation=generation)


class CommandRequest(WorkerRequest):
    """A command in a session's box (``farm.command``: ``session.exec``), claimed like a cell;
    ``stdin`` inline (base64), or staged in the box first (``stdin_path``)."""

    exec_id: str
    session_id: str
    generation: int
    argv: list[str]
    timeout_s: float
    cwd: str | None = None
    env: dict[str, str] | None = None
    max_output_bytes: int | None = None
    stdin: str | None = None
    stdin_path: str | None = None

    @field_validator("stdin")
    @classmethod
    def _is_base64(cls, value: str | None) -> str | None:
        if value is not None:
            base64.b64decode(value, validate=True)  # binascii.Error is a ValueError: refused
        return value

    def stdin_bytes(self) -> bytes | None:
        return base64.b64decode(self.stdin) if self.stdin else None


class FileOperation(WorkerRequest):
    """One chunk of a file operation as ``session.files`` builds it (the kernel's
    ``FileRequest``): the bytes of parcel ``parcel`` (``farm.stores.parcels``, raw in Redis)
    written at ``offset``, ``length`` bytes read from it (its reply names their parcel)."""

    op: FileOp
    path: str
    scope: FileScope = "workspace"
    offset: int | None = None
    length: int | None = None
    parcel: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    source: str | None = Field(default=None, description="the archive ``extract`` unpacks")

    def kernel_fields(self) -> dict[str, Any]:
        """The fields the kernel's file frame takes besides its op, path and bytes."""
        return self.model_dump(include={"scope", "offset", "length", "source"}, exclude_none=True)


class FileRequest(FileOperation):
    """A ``FileOperation`` in a session (``farm.file``): not claimed, not journaled; a chunk
    that runs twice writes the same bytes at the same offset."""

    session_id: str
    generation: int


class CloseRequest(WorkerRequest):
    """Close a session (``farm.close_session``); closing one already gone is no error."""

    session_id: str


class BranchRequest(WorkerRequest):
    """A checkpoint, rollback, drop or fork of an open session (``farm.branch``), sent to its
    worker generation's queue; ``checkpoint_id`` names the checkpoint of a rollback or drop."""

    session_id: str
    generation: int = Field(description="the worker generation it was sent to")
    op: Literal["checkpoint", "rollback", "drop", "fork"]
    checkpoint_id: str | None = None
    keep: bool = Field(default=True, description="a rollback keeps its checkpoint for later")
    n: int = Field(default=1, ge=1, description="how many forks")


class SnapshotRequest(WorkerRequest):
    """A snapshot of an open session (``farm.snapshot``), kept in the farm's store; with
    ``pause`` the session is closed after it, its snapshot kept under its paused id."""

    session_id: str
    generation: int = Field(description="the worker generation it was sent to")
    pause: bool = False


class DrainRequest(WorkerRequest):
    """Move every session of a worker to others (``farm.drain``), then stop taking work."""

    worker: str = Field(description="the worker it is meant for: another one refuses it")


class OpenRequest(WorkerRequest):
    """A session open, queued on its image's list of opens (``registry.opens_key``) until a
    worker has room for its box; the answer goes to the list ``reply``. The worker that takes
    it claims ``open_id`` first: an id its client abandoned opens nothing."""

    open_id: str
    reply: str = Field(description="the Redis list of its client's answers (each names its open)")
    tools: bool = True
    limits: dict[str, int] | None = None
    egress: list[str] | None = None
    sent_at: float = Field(description="the client's time.time() as it was queued")
    deadline: float = Field(description="time.time() past which no worker opens it")
    session_id: str | None = Field(default=None, description="its id (a resume or a move)")
    restore: str | None = Field(default=None, description="the kept snapshot it opens with")
    moved: bool = Field(default=False, description="a drain's move: a loss is told once")


class Malformed(ValueError):
    """A request that is not its model; its message names each wrong field."""

    def __init__(self, model: type[WorkerRequest], exc: ValidationError) -> None:
        faults = [
            f"{'.'.join(str(p) for p in error['loc']) or 'the request'}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)
        ]
        more = f"; and {len(faults) - MAX_NAMED} more" if len(faults) > MAX_NAMED else ""
        super().__init__(f"a malformed {model.__name__}: {'; '.join(faults[:MAX_NAMED])}{more}")


R = TypeVar("R", bound=WorkerRequest)


def arrived(model: type[R], raw: object) -> R:
    """``raw`` (a task's JSON argument) as ``model``, or ``Malformed`` saying what is wrong."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise Malformed(model, exc) from None
