"""``SessionSnapshots``: a worker's side of snapshots — taking one, restoring one into a box
just opened, and fencing the calls of a session while it moves away.

Invariants: the namespace is pickled and loaded by the session process itself (a cell sent
here, never journaled), so no pickle is ever loaded on a host; a session that moves or pauses
takes no call between its snapshot and its move (a call already running finishes first, one
that comes later is answered ``SessionMoved`` unrun, unclaimed: its client sends it again to
the new owner); a restored session is registered only once its state is back, so no call
reaches it empty. Design: docs/design/snapshots.md.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import ValidationError

from farm.errors import SnapshotError, SnapshotIncompatible, SnapshotNotFound, SnapshotTooLarge
from farm.events.run_events import Lifecycle
from farm.kernel.repl import namespace_snapshot as box
from farm.kernel.wire.client import KernelClient, KernelError
from farm.kernel.wire.protocol import FILE_CHUNK
from farm.models import (
    CommandResult,
    ErrorKind,
    ExecError,
    ExecResult,
    Malformed,
    SnapshotRequest,
    arrived,
)
from farm.models.snapshot_info import Restored, SnapshotInfo
from farm.stores.parcels import Parcels
from farm.stores.snapshot_store import RedisSnapshotStore, pack, paused_id, unpack

if TYPE_CHECKING:
    from farm.events.journal import Journal
    from farm.sandbox.sandbox_keeper import SandboxKeeper
    from farm.settings import FarmSettings

log = logging.getLogger(__name__)

MODULE = "farm.kernel.repl.namespace_snapshot"
DUMP_CELL = f'__import__("{MODULE}", fromlist=["dump"]).dump(globals())'
LOAD_CELL = f'__import__("{MODULE}", fromlist=["load"]).load(globals())'
CELL_TIMEOUT_S = 300.0  # pickling or loading a namespace of a few hundred MB
CHUNK = FILE_CHUNK  # bytes of a file frame, raw in its blob (``framing``)
QUIET_WAIT_S = 600.0  # a move waits this long for the session's running call to end
MOVED_KEPT_S = 3600.0  # a moved session's calls are answered ``SessionMoved`` this long
MANIFEST_BYTES = 4 << 20  # a manifest lists names and reasons: a few kB
Call = Callable[[object], dict[str, Any]]  # a task's handler: checks its raw request
Finder = Callable[[str, int], "tuple[Held | None, str]"]  # a session by id and generation
Action = Literal["snapshot", "restored", "paused", "resumed", "moved"]


class Held(Protocol):
    """A session as its worker holds it (``worker_state.HeldSession``), as snapshots see it."""

    epoch: int
    lost: str | None
    notice: str | None
    one_shot: bool
    limits: dict[str, int] | None
    egress: list[str] | None


class SnapshotHost(Protocol):
    """The worker as its snapshots see it (``Worker`` is one)."""

    id: str
    image: str
    settings: FarmSettings
    journal: Journal
    keeper: SandboxKeeper

    @property
    def sessions(self) -> Mapping[str, Held]: ...

    def kernel(self) -> AbstractContextManager[KernelClient]: ...

    def close_session(self, session_id: str) -> dict[str, Any]: ...


class SessionSnapshots:
    def __init__(self, worker: SnapshotHost, held: Finder) -> None:
        self.worker = worker
        self.held = held  # the live session a call names, or why none (``SessionCalls``)
        self.store = RedisSnapshotStore(worker.settings)
        self.parcels = Parcels(self.store.redis)  # file chunks beside Celery's messages
        self._cond = threading.Condition()
        self._active: dict[str, int] = {}
        self._moving: set[str] = set()
        self._moved: dict[str, tuple[str, float]] = {}  # session -> (where to, when)

    def close(self) -> None:
        self.store.close()

    # --- the calls of a session, fenced against its move ---------------------------------

    def guarded(self, request: object, call: Call, kind: str) -> dict[str, Any]:
        """Run ``call`` unless the session moved (or waits while it moves); ``kind`` is the
        reply's shape: ``exec``, ``command`` or ``file``."""
        if not isinstance(request, dict):  # malformed: the call itself refuses it
            return call(request)
        session_id = str(request.get("session_id") or "")
        deadline = time.monotonic() + QUIET_WAIT_S
        with self._cond:
            while session_id in self._moving and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            moved = self._moved.get(session_id)
            if moved is None:
                self._active[session_id] = self._active.get(session_id, 0) + 1
        if moved is not None:
            return moved_reply(kind, request, moved[0], self.worker.id)
        try:
            told = self._tell_loss(request) if kind == "exec" else None
            return told or call(request)
        finally:
            with self._cond:
                self._active[session_id] -= 1
                if not self._active[session_id]:
                    del self._active[session_id]
                self._cond.notify_all()

    def _tell_loss(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The first run after a move that could not carry everything: ``state_lost`` naming
        what was lost, unrun (never a silent reset)."""
        held = self.worker.sessions.get(str(request.get("session_id")))
        if held is None or not held.notice:
            return None
        notice, held.notice = held.notice, None
        return ExecResult.failure(
            ErrorKind.STATE_LOST,
            "StateLost",
            notice,
            exec_id=str(request.get("exec_id", "")),
            session_id=str(request.get("session_id", "")),
            epoch=held.epoch,
            worker=self.worker.id,
            state_lost=True,
        ).model_dump(mode="json")

    @contextmanager
    def quiet(self, session_id: str) -> Iterator[dict[str, str]]:
        """Hold the session's calls while the block moves it: its running call ends first.
        Set ``where["to"]`` in the block once it moved (then its calls are answered
        ``SessionMoved``); otherwise they go on here."""
        where: dict[str, str] = {}
        deadline = time.monotonic() + QUIET_WAIT_S
        with self._cond:
            self._moving.add(session_id)
            while self._active.get(session_id) and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            busy = bool(self._active.get(session_id))
        try:
            if busy:
                raise SnapshotError(f"session {session_id}'s running call did not end in time")
            yield where
        finally:
            with self._cond:
                self._moving.discard(session_id)
                if where.get("to"):
                    now = time.monotonic()
                    self._moved = {
                        k: v for k, v in self._moved.items() if now - v[1] < MOVED_KEPT_S
                    }
                    self._moved[session_id] = (where["to"], now)
                self._cond.notify_all()

    # --- taking a snapshot -----------------------------------------------------------------

    def take(self, raw: object) -> dict[str, Any]:
        """``session.snapshot()`` and ``pause()``: the snapshot kept in the store (``pause``:
        under the session's paused id, and the session closed here)."""
        try:
            request = arrived(SnapshotRequest, raw)
        except Malformed as exc:
            return {"error": {"code": "input", "message": str(exc)}}
        held, why = self.held(request.session_id, request.generation)
        session_id = request.session_id
        if held is None:
            return {"error": {"code": "sandbox_lost", "message": why}}
        pause = request.pause
        try:
            with self.quiet(session_id) if pause else _nothing() as where:
                info, blob = self.capture(session_id, held)
                snapshot_id = paused_id(session_id) if pause else info.id
                self.store.put(snapshot_id, blob, self.worker.settings.snapshot_ttl_s)
                if pause:
                    where["to"] = "paused"
                    self.worker.close_session(session_id)
        except SnapshotError as exc:
            return {"error": error_fields(exc)}
        except KernelError as exc:
            return {"error": {"code": "sandbox_lost", "message": f"its sandbox failed: {exc}"}}
        self.record(session_id, "paused" if pause else "snapshot", snapshot_id, info.lost)
        return {"id": snapshot_id, "snapshot": info.model_dump(mode="json")}

    def capture(self, session_id: str, held: Held) -> tuple[SnapshotInfo, bytes]:
        """The session's snapshot as a blob (``farm.stores.snapshot_store.pack``)."""
        limit = self.worker.settings.snapshot_max_bytes
        with self.worker.kernel() as kernel:
            raw = kernel.execute(
                session_id,
                DUMP_CELL,
                epoch=held.epoch,
                timeout_s=CELL_TIMEOUT_S,
                exec_id=uuid.uuid4().hex,
                max_output_bytes=64 * 1024,
                grace_s=self.worker.settings.limits.grace_s,
            )
            if raw["status"] != "ok":
                held.epoch = raw["epoch"]
                error: dict[str, Any] = dict(raw.get("error") or {})
                _remove(kernel, session_id)
                why = f"{error.get('ename')}: {error.get('evalue')}"
                raise SnapshotError(f"session {session_id} could not be snapshotted: {why}")
            try:
                # what the box wrote is the box's word: bounded, checked, sizes as read
                manifest = _manifest(_read(kernel, session_id, box.MANIFEST, MANIFEST_BYTES))
                namespace = _read(kernel, session_id, box.NAMESPACE, limit)
                room = limit - len(namespace)
                workspace = _read(kernel, session_id, box.WORKSPACE, room, len(namespace))
            finally:
                _remove(kernel, session_id)
        manifest.update(namespace_bytes=len(namespace), workspace_bytes=len(workspace))
        try:
            info = SnapshotInfo(
                id=uuid.uuid4().hex,
                session_id=session_id,
                worker=self.worker.id,
                image=self.worker.image,
                image_digest=self.worker.keeper.info().image_digest,
                created_at=time.time(),
                limits=held.limits,
                egress=held.egress,
                **manifest,
            )
        except ValidationError as exc:
            raise SnapshotError(f"the box's manifest is not valid: {exc}") from None
        return info, pack(info, namespace, workspace)

    # --- restoring one -----------------------------------------------------------------------

    def put_back(self, session_id: str, epoch: int, snapshot_id: str) -> Restored:
        """Load kept snapshot ``snapshot_id`` into session ``session_id``, just opened here."""
        t0 = time.perf_counter()
        blob = self.store.get(snapshot_id)
        if blob is None:
            raise SnapshotNotFound(f"no snapshot is kept as {snapshot_id} (expired, or used)")
        info, namespace, workspace = unpack(blob)
        del blob
        manifest = info.model_dump(include={"python", "pickler", "modules"})
        with self.worker.kernel() as kernel:
            staged = f"{box.DIR}/{box.WORKSPACE}"
            _write(kernel, session_id, staged, workspace)
            _check(kernel.file(session_id, "extract", ".", source=staged), staged)
            _write(kernel, session_id, f"{box.DIR}/{box.MANIFEST}", json.dumps(manifest).encode())
            _write(kernel, session_id, f"{box.DIR}/{box.NAMESPACE}", namespace)
            raw = kernel.execute(
                session_id,
                LOAD_CELL,
                epoch=epoch,
                timeout_s=CELL_TIMEOUT_S,
                exec_id=uuid.uuid4().hex,
                max_output_bytes=1 << 20,
                grace_s=self.worker.settings.limits.grace_s,
            )
        error: dict[str, Any] = dict(raw.get("error") or {})
        if raw["status"] != "ok":
            why = f"{error.get('evalue')}"
            if error.get("ename") == "SnapshotIncompatible":
                raise SnapshotIncompatible(f"snapshot {info.id} cannot be restored here: {why}")
            raise SnapshotError(
                f"snapshot {info.id} could not be loaded: {error.get('ename')}: {why}"
            )
        with self._cond:  # back here (a resume): its calls run here again
            self._moved.pop(session_id, None)
        lost = {**info.lost, **_load_report(raw["stdout"])}
        self.record(session_id, "restored", info.id, lost)
        return Restored(
            session_id=session_id,
            worker=self.worker.id,
            snapshot=info,
            lost=lost,
            duration_s=time.perf_counter() - t0,
        )

    def record(
        self, session_id: str, action: Action, snapshot_id: str, lost: dict[str, str]
    ) -> None:
        """A ``Lifecycle`` event in the session's journal (best effort: a move goes on)."""
        event = Lifecycle(
            exec_id=uuid.uuid4().hex,
            session_id=session_id,
            seq=0,
            ts=time.time(),
            action=action,
            worker=self.worker.id,
            snapshot_id=snapshot_id,
            lost=lost,
        )
        try:
            self.worker.journal.append([event])
        except Exception as exc:
            log.warning("session %s: its %s event was not journaled: %s", session_id, action, exc)


def error_fields(exc: SnapshotError) -> dict[str, Any]:
    """A snapshot error as a reply's ``error`` (the client raises the same class again)."""
    fields: dict[str, Any] = {"code": exc.code, "message": str(exc)}
    if isinstance(exc, SnapshotTooLarge):
        fields.update(size=exc.size, limit=exc.limit)
    return fields


def moved_reply(kind: str, request: dict[str, Any], where: str, worker: str) -> dict[str, Any]:
    """The answer to a call that came after its session moved (or paused): unrun."""
    session_id = str(request.get("session_id"))
    ename = "SessionPaused" if where == "paused" else "SessionMoved"
    evalue = (
        f"session {session_id} is paused: resume it"
        if where == "paused"
        else f"session {session_id} moved to worker {where}; nothing was run here"
    )
    if kind == "file":
        return {"error": {"ename": ename, "evalue": evalue, "errno": 0, "path": ""}}
    if kind == "command":
        error = ExecError(ename=ename, evalue=evalue, kind=ErrorKind.SANDBOX_LOST)
        return CommandResult(
            exec_id=request["exec_id"], session_id=session_id, worker=worker, error=error
        ).model_dump(mode="json")
    return ExecResult.failure(
        ErrorKind.SANDBOX_LOST,
        ename,
        evalue,
        exec_id=request["exec_id"],
        session_id=session_id,
        epoch=request.get("epoch", 0),
        worker=worker,
    ).model_dump(mode="json")


@contextmanager
def _nothing() -> Iterator[dict[str, str]]:
    yield {}


def _manifest(raw: bytes) -> dict[str, Any]:
    try:
        manifest = json.loads(raw)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise SnapshotError("the box's manifest is not a JSON object")
    return manifest


def _load_report(stdout: str) -> dict[str, str]:
    """What ``load`` printed last: the modules it could not import (the snapshot's own code
    may print before it, and anything: a line that is not the report says so)."""
    lines = stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])["lost"]
        return {str(k): str(v) for k, v in report.items()}
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        return {"?": "the restore's report could not be read; some modules may be missing"}


def _read(kernel: KernelClient, session_id: str, name: str, room: int, already: int = 0) -> bytes:
    """A file the box wrote, refused once it is past ``room`` bytes (``already``: what the
    snapshot holds before it, for the error's size)."""
    path, parts, offset = f"{box.DIR}/{name}", [], 0
    while True:
        reply = kernel.file(session_id, "read", path, offset=offset, length=CHUNK)
        result = _check(reply, path)
        size = max(int(result["size"]), offset)
        if size > room:
            raise SnapshotTooLarge(already + size, already + room)
        parts.append(reply.get("blob", b""))
        offset += len(parts[-1])
        if result["eof"] or not parts[-1]:
            return b"".join(parts)


def _write(kernel: KernelClient, session_id: str, path: str, data: bytes) -> None:
    for offset in range(0, max(len(data), 1), CHUNK):
        chunk = data[offset : offset + CHUNK]
        _check(kernel.file(session_id, "write", path, blob=chunk, offset=offset), path)


def _remove(kernel: KernelClient, session_id: str) -> None:
    kernel.file(session_id, "remove", box.DIR)


def _check(reply: Any, path: str) -> Any:
    error = reply.get("error")
    if error:
        raise SnapshotError(f"{path} in the box: {error.get('ename')}: {error.get('evalue')}")
    return reply["result"]
