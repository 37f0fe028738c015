"""Snapshots, pause and resume, drains and moves of sessions, as a caller sees them.

``Session.snapshot`` asks the owning worker for a snapshot (``farm.worker.snapshot_calls``),
kept in the farm's store or handed back as bytes; ``Farm.restore`` opens a session with one on
any worker of its image. A session that moved (a resume, a drain) is followed: the registry
names its new owner, a call its old owner answered ``SessionMoved`` (unrun) is sent again there
with the same exec id, and so is one left unclaimed in a stopped worker's queue. Not
``farm.client.journal_replay``, which re-runs cells after a loss. Design:
docs/design/snapshots.md.
"""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from farm.backoff import delays
from farm.celeryconf import TASK_DRAIN, TASK_EXEC, TASK_SNAPSHOT
from farm.client.broker import Watch
from farm.client.exec_call import Call
from farm.client.opening import open_once
from farm.errors import (
    FarmBusy,
    InvalidRequest,
    SessionLost,
    SessionPaused,
    SnapshotError,
    SnapshotIncompatible,
    SnapshotNotFound,
    SnapshotTooLarge,
)
from farm.image_name import ImageName
from farm.models import DrainRequest, ExecRequest, Opened, Refused, SnapshotRequest
from farm.models.snapshot_info import DrainReport, SnapshotInfo
from farm.stores.parcels import Parcels
from farm.stores.snapshot_store import RedisSnapshotStore, header, paused_id

if TYPE_CHECKING:
    from farm.client.broker import Broker
    from farm.client.opening import Answers
    from farm.registry import Registry
    from farm.settings import FarmSettings

SNAPSHOT_WAIT_S = 900.0  # a snapshot of a few hundred MB, and the session's running call
DRAIN_WAIT_S = 1800.0
MAX_MOVES = 8  # a session moves a few times at most while one call is sent or waits
UPLOAD_TTL_S = 3600.0  # a caller's snapshot bytes, kept while its restore opens
ERRORS = {e.code: e for e in (SnapshotError, SnapshotIncompatible, SnapshotNotFound)}


@dataclass
class Snapshot:
    """A session's snapshot: ``info``, and its bytes (``data``, portable: any process may
    ``Farm.restore`` them) or, kept by the farm, the ``id`` it is kept under."""

    info: SnapshotInfo
    data: bytes | None = None
    id: str | None = None

    def __bytes__(self) -> bytes:
        if self.data is None:
            raise SnapshotError(f"snapshot {self.id} is kept by the farm: restore it by id")
        return self.data


class SnapshotFarm(Protocol):
    """What snapshots use of a farm (``Farm`` is one)."""

    @property
    def settings(self) -> FarmSettings: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def answers(self) -> Answers: ...

    def require_image(self, image: str | ImageName) -> None: ...


class MovingFarm(Protocol):
    """What following a moved session uses of its farm (``Farm`` is one)."""

    @property
    def broker(self) -> Broker: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def snapshots(self) -> Snapshots: ...


class Movable(Protocol):
    """A session as its snapshots and moves see it (``Session`` is one): where it lives now,
    and the check before a send."""

    id: str
    worker: str
    generation: int
    queue: str
    epoch: int
    _kernel_epoch: int

    @property
    def farm(self) -> MovingFarm: ...

    def _check_alive(self) -> str: ...


# --- the worker requests (dicts, built here only) ---------------------------------------------


def snapshot_request(session: Movable, *, pause: bool = False) -> dict[str, Any]:
    request = SnapshotRequest(session_id=session.id, generation=session.generation, pause=pause)
    return request.model_dump(mode="json")


def drain_request(worker_id: str) -> dict[str, Any]:
    return DrainRequest(worker=worker_id).model_dump(mode="json")


class Snapshots:
    """A farm's snapshots: its store, restores, resumes, drains (``Farm.snapshots``)."""

    def __init__(self, farm: SnapshotFarm) -> None:
        self.farm = farm
        self._store: RedisSnapshotStore | None = None

    @property
    def store(self) -> RedisSnapshotStore:
        if self._store is None:
            self._store = RedisSnapshotStore(self.farm.settings)
        return self._store

    @property
    def parcels(self) -> Parcels:
        """File chunks beside Celery's messages, raw (``farm.stores.parcels``)."""
        return Parcels(self.store.redis)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def take(self, session: Movable, *, keep: bool = False, pause: bool = False) -> Snapshot:
        """``session``'s snapshot from its worker: kept (an id) or handed back (bytes)."""
        reply = self._ask_owner(session, snapshot_request(session, pause=pause))
        info = SnapshotInfo.model_validate(reply["snapshot"])
        if keep or pause:
            return Snapshot(info, id=reply["id"])
        data = self.farm.broker.call(lambda: self.store.get(reply["id"]), sent=True)
        self.farm.broker.quietly(lambda: self.store.delete(reply["id"]))
        if data is None:
            raise SnapshotNotFound(f"snapshot {reply['id']} expired before it was read")
        return Snapshot(info, data=data)

    def _ask_owner(self, session: Movable, request: dict[str, Any]) -> dict[str, Any]:
        pending, mark = routed_send(session, TASK_SNAPSHOT, request)
        watch = Watch((session.worker, session.generation), None, mark, session.id)
        reply: dict[str, Any] = self.farm.broker.wait(
            pending, time.monotonic() + SNAPSHOT_WAIT_S, watch
        )
        if reply.get("error"):
            raise _error(session, reply["error"])
        return reply

    def restore(
        self,
        snapshot: Snapshot | bytes | str,
        *,
        image: str | ImageName | None = None,
        limits: dict[str, int] | None = None,
        session_id: str | None = None,
        moved: bool = False,
    ) -> Opened:
        """Open a session with ``snapshot`` (bytes, a ``Snapshot``, or the id of a kept one)
        on a worker of its image (or ``image``), in a box of its limits (or ``limits``); the
        worker's ``Opened`` says what came back."""
        upload = None
        if isinstance(snapshot, Snapshot) and snapshot.data is None:
            snapshot = str(snapshot.id)
        if isinstance(snapshot, str):
            snapshot_id = snapshot
            info = self.farm.broker.call(lambda: self.store.info(snapshot_id), sent=False)
            if info is None:
                raise SnapshotNotFound(f"no snapshot is kept as {snapshot_id}")
        else:
            blob = bytes(snapshot)
            info = header(blob)[0]
            limit = self.farm.settings.snapshot_max_bytes
            if info.size > limit:
                raise SnapshotTooLarge(info.size, limit)
            snapshot_id = upload = f"upload-{uuid.uuid4().hex}"
            self.farm.broker.call(lambda: self.store.put(upload, blob, UPLOAD_TTL_S), sent=False)
        try:
            fields = {
                "session_id": session_id,
                "restore": snapshot_id,
                "moved": moved,
                "limits": limits or info.limits,
                "egress": info.egress,
            }
            return self._open(ImageName.parse(image or info.image), fields)
        finally:
            if upload is not None:
                self.farm.broker.quietly(lambda: self.store.delete(upload))

    def _open(self, name: ImageName, fields: dict[str, Any]) -> Opened:
        farm = self.farm
        farm.require_image(name)
        deadline = time.monotonic() + farm.settings.open_wait_s
        for backoff in delays(0.05, 1.0):
            reply = open_once(farm.broker, farm.answers, name.queue, fields, deadline)
            if isinstance(reply, Opened):
                return reply
            if isinstance(reply, Refused):
                if reply.code is not None:
                    raise ERRORS.get(reply.code, SnapshotError)(reply.reason)
                raise InvalidRequest(f"worker {reply.worker} refused the restore: {reply.reason}")
            if time.monotonic() + backoff > deadline:
                raise FarmBusy(
                    f"no worker of image {name.asked!r} took the restore: {reply.reason}"
                )
            time.sleep(backoff)  # back off before asking again
        raise AssertionError("unreachable")

    def resume(self, session_id: str) -> Opened:
        """Open paused session ``session_id`` again, same id, on any worker of its image."""
        kept = paused_id(session_id)
        opened = self.restore(kept, session_id=session_id)
        self.farm.broker.quietly(lambda: self.store.delete(kept))
        return opened

    def paused(self, session_id: str) -> bool:
        return self.farm.broker.quietly(lambda: self.store.info(paused_id(session_id))) is not None

    def drain(self, worker_id: str) -> DrainReport:
        """Move every session of ``worker_id`` to other workers (``farm.worker.drain``)."""
        entry = self.farm.broker.call(lambda: self.farm.registry.worker(worker_id), sent=False)
        if entry is None:
            raise InvalidRequest(f"no live worker {worker_id!r}")
        owner = (worker_id, int(entry["generation"]))
        pending, mark = self.farm.broker.send(
            TASK_DRAIN, str(entry["queue"]), args=[drain_request(worker_id)]
        )
        watch = Watch(owner, None, mark)
        raw = self.farm.broker.wait(pending, time.monotonic() + DRAIN_WAIT_S, watch)
        if raw.get("error"):
            raise InvalidRequest(str(raw["error"]["message"]))
        return DrainReport.model_validate(raw)


# --- following a session that moved ------------------------------------------------------------


def adopt(session: Movable, opened: Opened) -> None:
    """``session`` now lives where ``opened`` says (same id, its state carried)."""
    session.worker, session.generation = opened.worker, opened.generation
    session.queue, session.epoch = opened.queue, opened.epoch
    session._kernel_epoch = opened.epoch


def follow(session: Movable) -> bool:
    """Whether the registry names a new live owner of ``session`` (then adopted); a paused
    session is ``SessionPaused``."""
    registry = session.farm.registry
    entry = session.farm.broker.quietly(lambda: registry.session(session.id))
    if entry is None:
        if session.farm.snapshots.paused(session.id):
            raise SessionPaused(session.id, session.worker, "it was paused: resume() it")
        return False
    owner = (str(entry["worker"]), int(entry["generation"]))
    if owner == (session.worker, session.generation):
        return False
    if not session.farm.broker.quietly(lambda: registry.worker_alive(*owner)):
        return False
    opened = Opened(
        session_id=session.id,
        worker=owner[0],
        generation=owner[1],
        queue=str(entry["queue"]),
        epoch=int(entry["epoch"]),
    )
    adopt(session, opened)
    return True


def wait_result(session: Movable, call: Call) -> dict[str, Any]:
    """A run's raw result, sent again to the session's new owner when the old one answered
    ``SessionMoved`` or stopped with the call unclaimed (it never ran)."""
    farm, exec_id = session.farm, call.request.exec_id
    for _ in range(MAX_MOVES):
        try:
            raw: dict[str, Any] = farm.broker.wait(call.pending, call.deadline, call.watch)
        except SessionLost:
            unrun = farm.broker.quietly(lambda: farm.registry.exec_record(exec_id)) is None
            if not (unrun and _moved_since(session, call)):
                raise
        else:
            moved = (raw.get("error") or {}).get("ename") == "SessionMoved"
            if not (moved and _moved_since(session, call)):
                return raw
        call = _resend(session, call)
    raise SessionLost(session.id, session.worker, "it kept moving while a call waited")


class _Rerouted(Exception):
    """The check before a send followed the session elsewhere: build the send again."""


def routed_send(
    session: Movable, task: str, request: dict[str, Any], *, lane: bool = False
) -> tuple[Any, str]:
    """Send ``request`` to ``session``'s owner as the check before the send finds it (one
    that moved is followed, and the request's ``generation`` and ``epoch`` named anew);
    ``lane``: a plain run, on its owner's run lane (``farm.events.lanes``), not as ``task``."""
    for _ in range(MAX_MOVES):
        queue = session.queue
        request["generation"] = session.generation
        if "epoch" in request:
            request["epoch"] = session.epoch
        check = functools.partial(_checked, session, queue)
        try:
            if lane:
                return session.farm.broker.push_run(queue, request, check=check)
            return session.farm.broker.send(task, queue, args=[request], check=check)
        except _Rerouted:
            continue
    raise SessionLost(session.id, session.worker, "it kept moving while a call was sent")


def _checked(session: Movable, queue: str) -> str:
    mark = session._check_alive()
    if session.queue != queue:
        raise _Rerouted
    return mark


def _moved_since(session: Movable, call: Call) -> bool:
    """Whether ``session`` lives elsewhere than where ``call`` went."""
    return follow(session) or call.watch.worker != (session.worker, session.generation)


def _resend(session: Movable, call: Call) -> Call:
    wire = call.request.model_dump(mode="json")
    pending, mark = routed_send(session, TASK_EXEC, wire, lane=not call.request.stream)
    watch = Watch((session.worker, session.generation), call.request.exec_id, mark, session.id)
    return Call(pending, ExecRequest.model_validate(wire), call.deadline, watch)


def _error(session: Movable, fields: dict[str, Any]) -> Exception:
    code = fields.get("code")
    if code == "sandbox_lost":
        return SessionLost(session.id, session.worker, str(fields.get("message")))
    if code == SnapshotTooLarge.code:
        return SnapshotTooLarge(int(fields["size"]), int(fields["limit"]))
    return ERRORS.get(str(code), SnapshotError)(str(fields.get("message")))
