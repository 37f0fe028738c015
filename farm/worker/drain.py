"""``Drain``: a worker moves its live sessions to other workers of its image, same ids.

``farm drain WORKER`` (a ``farm.drain`` task on its direct queue) and a stopping worker
(``Worker.stop``, SIGTERM; Kubernetes' preStop runs ``farm drain``) end here. The worker first
takes no new session (its intake stops, its heartbeat says ``draining``); then each session is
quieted (its running call ends first), snapshotted and opened elsewhere with its id; the new
owner registers it, and calls that still reach this worker are answered ``SessionMoved``,
unrun, for the client to send again. A session that cannot be moved stays here (a drain) or
is lost saying why (a stop); one whose snapshot could not carry everything tells its next run
what it lost (``state_lost``), never a silent reset. Design: docs/design/snapshots.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from farm.errors import SnapshotError
from farm.image_name import ImageName
from farm.kernel.wire.client import KernelError
from farm.models import Busy, DrainRequest, Malformed, Opened, OpenRequest, Refused, arrived
from farm.models.snapshot_info import DrainReport
from farm.registry import opens_key
from farm.worker.snapshot_calls import Held, SessionSnapshots, SnapshotHost

if TYPE_CHECKING:
    from farm.registry import Registry

log = logging.getLogger(__name__)

MOVES_AT_ONCE = 8  # sessions snapshotted and reopened at a time
MOVE_OPEN_S = 30.0  # how long a move waits for another worker to open it
ANSWER_SLICE_S = 1.0
MOVE_KEEP_S = 600.0  # a move's snapshot in the store, while the new owner reads it


class Stoppable(Protocol):
    def stop(self) -> None: ...


class DrainHost(SnapshotHost, Protocol):
    """The worker as its drain sees it (``Worker`` is one)."""

    registry: Registry
    draining: bool

    @property
    def intake(self) -> Stoppable: ...

    @property
    def snapshots(self) -> SessionSnapshots: ...

    def beat_now(self) -> None: ...

    def let_go_moved(self, session_id: str) -> None: ...


class Drain:
    def __init__(self, worker: DrainHost) -> None:
        self.worker = worker

    def asked(self, raw: object) -> dict[str, Any]:
        """``farm drain``'s task: a ``DrainRequest`` meant for this worker, or why not."""
        try:
            request = arrived(DrainRequest, raw)
        except Malformed as exc:
            return {"error": {"code": "input", "message": str(exc)}}
        if request.worker != self.worker.id:
            message = f"a drain of worker {request.worker} reached worker {self.worker.id}"
            return {"error": {"code": "input", "message": message}}
        return self.run().model_dump(mode="json")

    def run(self, stopping: bool = False) -> DrainReport:
        """Move every movable session away; ``stopping``: those that cannot be moved are
        lost (the worker goes), else they stay here."""
        worker = self.worker
        t0 = time.perf_counter()
        worker.draining = True
        worker.intake.stop()
        with contextlib.suppress(Exception):
            worker.beat_now()  # others see it draining at once: none sends it a move
        report = DrainReport(worker=worker.id)
        movable = [
            (sid, held)
            for sid, held in list(worker.sessions.items())
            if held.lost is None and not held.one_shot
        ]
        if not movable:
            return report
        if movable and not self._others():
            why = f"no other live worker of image {worker.image!r} takes sessions"
            report.failed = {sid: why for sid, _ in movable}
            movable = []
        with ThreadPoolExecutor(MOVES_AT_ONCE, thread_name_prefix="drain") as pool:
            for sid, outcome in zip(
                [sid for sid, _ in movable], pool.map(self._move_one, movable), strict=True
            ):
                if isinstance(outcome, str):
                    report.failed[sid] = outcome
                else:
                    report.moved[sid] = outcome.worker
                    if outcome.restored is not None and outcome.restored.lost:
                        report.lost[sid] = "; ".join(sorted(outcome.restored.lost))
        if stopping:
            for sid, why in report.failed.items():
                held = worker.sessions.get(sid)
                if held is not None:
                    held.lost = f"the worker stopped and could not move it: {why}"
        report.duration_s = time.perf_counter() - t0
        log.info(
            "worker %s drained: %d moved, %d not (%.1f s)",
            worker.id,
            len(report.moved),
            len(report.failed),
            report.duration_s,
        )
        return report

    def _others(self) -> list[dict[str, Any]]:
        return [
            w
            for w in self.worker.registry.workers()
            if w.get("image") == self.worker.image
            and w.get("id") != self.worker.id
            and w.get("ready")
            and not w.get("draining")
        ]

    def _move_one(self, item: tuple[str, Held]) -> Opened | str:
        """Move one session: the new owner's ``Opened``, or why it could not be moved."""
        session_id, held = item
        snapshots = self.worker.snapshots
        try:
            with snapshots.quiet(session_id) as where:
                info, blob = snapshots.capture(session_id, held)
                key = f"move-{session_id}-{uuid.uuid4().hex[:8]}"
                snapshots.store.put(key, blob, MOVE_KEEP_S)
                del blob
                try:
                    opened = self._open_elsewhere(session_id, key, held)
                finally:
                    snapshots.store.delete(key)
                where["to"] = opened.worker
                self.worker.let_go_moved(session_id)
        except (SnapshotError, KernelError) as exc:
            log.warning("session %s could not be moved off %s: %s", session_id, self.worker.id, exc)
            return str(exc)
        lost = opened.restored.lost if opened.restored is not None else {}
        snapshots.record(session_id, "moved", info.id, lost)
        return opened

    def _open_elsewhere(self, session_id: str, snapshot_id: str, held: Held) -> Opened:
        """Queue the session's open on its image's list (this worker takes no more) and wait
        for the worker that takes it; one nobody took in time is taken back."""
        registry = self.worker.registry
        reply_key = f"farm:answers:drain-{uuid.uuid4().hex}"
        request = OpenRequest(
            open_id=uuid.uuid4().hex,
            reply=reply_key,
            sent_at=time.time(),
            deadline=time.time() + MOVE_OPEN_S,
            session_id=session_id,
            restore=snapshot_id,
            moved=True,
            limits=held.limits,
            egress=held.egress,
        )
        body, key = request.model_dump_json(), opens_key(ImageName(self.worker.image).queue)
        registry.push_open(key, body)
        deadline = time.monotonic() + MOVE_OPEN_S
        while time.monotonic() < deadline + ANSWER_SLICE_S * 5:
            raw = registry.wait_answer(reply_key, ANSWER_SLICE_S)
            if raw is not None:
                answer = json.loads(raw)["answer"]
                if answer.get("refused"):
                    raise SnapshotError(Refused.model_validate(answer).reason)
                if answer.get("busy"):
                    raise SnapshotError(f"no room: {Busy.model_validate(answer).reason}")
                return Opened.model_validate(answer)
            gone = not self._others()  # every other worker stops too: none will take it
            if (gone or time.monotonic() > deadline) and registry.abandon(request.open_id):
                registry.take_back(key, body)
                break
        raise SnapshotError(f"no other worker opened it within {MOVE_OPEN_S:g} s")
