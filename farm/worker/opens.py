"""``SessionOpens``: a worker's side of session opens — taken from Redis when it has room,
opened in a box of its own, answered on the open's own list.

Invariants: an open is claimed (its ``open_id``) before anything of it opens, so one its client
abandoned opens nothing; a session's box holds its room at the gate from its open to its close
or loss (``Worker._let_go``); every open taken gets an answer (opened, busy: ask again;
refused: never ask again), never silence. Design: docs/design/admission.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from farm.errors import SnapshotError
from farm.kernel.wire.client import KernelError, KernelRequestError
from farm.kernel.wire.protocol import INPUT_CODES
from farm.models import Busy, Opened, OpenRequest, Refused
from farm.worker.box_gate import KERNEL_WAIT_S, OPEN_WAIT_S, OPEN_WAITERS, Ticket, weight
from farm.worker.worker_egress import PolicyError
from farm.worker.worker_host import WorkerHost

log = logging.getLogger(__name__)

OPEN_THREADS = 64  # started as needed: opens taken from Redis wait for their box on these
OPEN_CLAIM_KEEP_S = 600  # an open's claim outlives its client's wait (its deadline)


class SessionOpens:
    def __init__(self, worker: WorkerHost) -> None:
        self.worker = worker
        self.pool = ThreadPoolExecutor(OPEN_THREADS, thread_name_prefix="open")

    def stop(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def take(self, body: str) -> None:
        """An open the intake took: claimed, its box queued at the gate at once (ahead of map
        items: the intake takes no more while it waits there), then opened on a thread of
        its own, which answers it. One past its deadline is its client's to abandon."""
        worker = self.worker
        taken = time.time()
        request = OpenRequest.model_validate_json(body)
        if taken > request.deadline:
            return
        claim = worker.registry.claim_exec(
            request.open_id, worker.id, worker.generation, keep_s=OPEN_CLAIM_KEEP_S
        )
        if claim is not None:  # abandoned by its client, or a copy of it taken elsewhere
            return
        try:
            policy = worker.egress.policy(request.egress)
        except PolicyError as exc:
            self._answer(request, Refused(worker=worker.id, reason=str(exc)).model_dump())
            return
        ticket = worker.gate.queue_open(weight(request.limits, worker.box_defaults()))
        queued_s = max(taken - request.sent_at, 0.0)
        try:
            self.pool.submit(self._open_queued, request, policy, ticket, queued_s)
        except RuntimeError:  # the worker stops
            if not worker.gate.cancel(ticket):
                worker.gate.release(ticket)
            self._answer(request, self.busy("the worker is stopping"))

    def _open_queued(
        self, request: OpenRequest, policy: Any, ticket: Ticket, queued_s: float
    ) -> None:
        try:
            admitted = self.worker.gate.admitted(ticket, request.deadline - time.time())
            if admitted is None:
                reply = self.busy("no room for its box before its client's deadline")
            else:
                reply = self.open_admitted(
                    request.tools, request.limits, policy, ticket, queued_s, request
                )
        except Exception as exc:  # farm's own failure: an answer still, the client asks again
            log.exception("worker %s could not open %s", self.worker.id, request.open_id)
            reply = self.busy(f"the worker failed to open it: {exc!r}")
        self._answer(request, reply)

    def _answer(self, request: OpenRequest, reply: dict[str, Any]) -> None:
        message = {"open_id": request.open_id, "answer": reply}
        self.worker.registry.answer(request.reply, json.dumps(message))

    def for_run(
        self, limits: dict[str, Any] | None, egress: list[str] | None, wait_s: float
    ) -> dict[str, Any]:
        """A session for a one-shot run (``SessionCalls.run_once``), whose message holds one
        of the worker's threads: it waits at the gate for at most ``OPEN_WAIT_S``, and busy
        at once when ``OPEN_WAITERS`` such opens wait here already."""
        worker = self.worker
        if not worker.keeper.ready:
            return Busy(worker=worker.id, reason=worker.keeper.last_error).model_dump()
        try:
            policy = worker.egress.policy(egress)
        except PolicyError as exc:
            return Refused(worker=worker.id, reason=str(exc)).model_dump()
        if worker.gate.waiting()["open"] >= OPEN_WAITERS:
            return self.busy(f"{OPEN_WAITERS} opens wait for room here already")
        waited = min(wait_s, OPEN_WAIT_S)
        ticket = worker.gate.open(weight(limits, worker.box_defaults()), waited)
        if ticket is None:
            return self.busy(f"no room for a box within {waited:g} s")
        opened = self.open_admitted(True, limits, policy, ticket, 0.0)
        held = worker.sessions.get(str(opened.get("session_id")))
        if held is not None:
            held.one_shot = True  # a drain leaves it: it closes after its run
        return opened

    def open_admitted(
        self,
        tools: bool,
        limits: dict[str, Any] | None,
        policy: Any,
        ticket: Ticket,
        queued_s: float,
        request: OpenRequest | None = None,
    ) -> dict[str, Any]:
        """Open a session whose box the gate admitted (``ticket``): the reply; the ticket goes
        back when nothing opened. A ``request`` naming a snapshot opens with it restored."""
        worker = self.worker
        session_id = uuid.uuid4().hex if policy is not None else None
        if request is not None and request.session_id is not None:
            session_id = request.session_id
        try:  # the box's defaults are the kernel's own (FarmSettings.box, given at its start)
            if session_id is not None and policy is not None:
                worker.egress.expect(session_id, policy)
            with worker.kernel() as kernel:
                opened = kernel.open_session(
                    tools=tools,
                    limits=limits,
                    session_id=session_id,
                    egress=policy is not None,
                    wait_s=KERNEL_WAIT_S,
                )
        except BaseException as exc:
            worker.egress.forget(session_id or "")
            worker.gate.release(ticket)
            return self._failed(exc)
        session_id, epoch = opened["session_id"], opened["epoch"]
        restored = None
        if request is not None and request.restore is not None:
            try:  # registered below only once its state is back: no call finds it empty
                restored = worker.snapshots.put_back(session_id, epoch, request.restore)
            except (SnapshotError, KernelError) as exc:
                worker.egress.forget(session_id)
                with contextlib.suppress(KernelError), worker.kernel() as kernel:
                    kernel.close_session(session_id)
                worker.gate.release(ticket)
                code = exc.code if isinstance(exc, SnapshotError) else "snapshot_failed"
                return Refused(worker=worker.id, reason=str(exc), code=code).model_dump()
        worker.hold(session_id, epoch, ticket)
        held = worker.sessions[session_id]
        held.limits, held.egress = limits, request.egress if request is not None else None
        if restored is not None and request is not None and request.moved and restored.lost:
            worker.sessions[session_id].notice = (
                f"session {session_id} moved to worker {worker.id} without: "
                + "; ".join(f"{name} ({why})" for name, why in sorted(restored.lost.items()))
            )
        return Opened(
            session_id=session_id,
            epoch=epoch,
            worker=worker.id,
            generation=worker.generation,
            queue=worker.queue,
            queue_s=queued_s + ticket.waited_s + opened["queue_s"],
            restored=restored,
        ).model_dump()

    def _failed(self, exc: BaseException) -> dict[str, Any]:
        """The reply to an open the kernel refused or failed: busy for what waiting (or
        another sandbox) may cure, refused for bad limits; anything else is raised."""
        if isinstance(exc, KernelRequestError):
            if exc.code in INPUT_CODES:
                return Refused(worker=self.worker.id, reason=str(exc)).model_dump()
            return self.busy(str(exc))  # too_many_sessions, unavailable: nothing opened
        if isinstance(exc, KernelError):  # the sandbox is failing: let the client try elsewhere
            return self.busy(f"sandbox failed: {exc}")
        raise exc

    def busy(self, why: str) -> dict[str, Any]:
        """A busy reply saying why, and the worker's room."""
        room = self.worker.room()
        held = f"{room['in_use']} of {room['boxes']} boxes in use, {room['sessions']} sessions"
        return Busy(worker=self.worker.id, reason=f"{why} ({held})").model_dump()
