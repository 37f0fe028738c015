"""A worker's checkpoints, rollbacks and forks of the sessions it holds (``TASK_BRANCH``).

A ``BranchRequest`` is checked on arrival (malformed: an ``input`` refusal). A rollback moves the
session's epoch, written to the registry before the answer, so that a call of the line left
behind is refused as ``state_lost``; the op's journal event, the session's entry and (given the
task's ``TaskReply``) the answer are written by one script (``Registry.finish_branch``). A
refusal is ``{"error": {"code", "message"}}`` and the session lives on; the client raises its
typed error (``farm.errors.error_for_branch``). Design: docs/design/fork.md.
"""

from __future__ import annotations

import logging
from typing import Any

from farm.kernel.wire.branch_frames import Branch, Branched
from farm.kernel.wire.client import KernelError, KernelRequestError
from farm.models import BranchRequest, Malformed, arrived
from farm.worker.box_gate import KERNEL_WAIT_S, Ticket, weight
from farm.worker.recorder import branch_event
from farm.worker.session_calls import BRANCH_TIMEOUT_S, SessionCalls
from farm.worker.task_reply import TaskReply
from farm.worker.worker_host import WorkerHost

log = logging.getLogger(__name__)

FORK_ROOM_WAIT_S = 2.0  # how long a fork's boxes wait for room at the worker's gate


def branch_request(request: BranchRequest) -> Branch:
    """The kernel's ``branch`` frame for a client's request."""
    message: Branch = {"type": "branch", "op": request.op, "session_id": request.session_id}
    if request.checkpoint_id is not None:
        message["checkpoint_id"] = request.checkpoint_id
    if request.op == "rollback" and not request.keep:
        message["keep"] = False
    if request.op == "fork":
        message["n"] = request.n
        message["wait_s"] = KERNEL_WAIT_S
    return message


def refusal(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def branch(
    worker: WorkerHost, calls: SessionCalls, raw: object, reply: TaskReply | None = None
) -> dict[str, Any]:
    """Do one branch op on a session held here: the kernel's ``branched`` reply, or why not;
    with its task's ``reply``, the answer is stored and published by the op's last script."""
    try:
        request = arrived(BranchRequest, raw)
    except Malformed as exc:
        return refusal("input", str(exc))
    held, why = calls.held(request.session_id, request.generation)
    if held is None:
        return refusal("session_lost", why)
    session_id = request.session_id
    tickets = _room(worker, request.n) if request.op == "fork" else []
    if tickets is None:
        return refusal("budget_exceeded", f"worker {worker.id} has no room for the forks")
    try:
        with worker.kernel() as kernel:
            done = kernel.branch(branch_request(request), BRANCH_TIMEOUT_S)
    except KernelError as exc:
        for ticket in tickets:
            worker.gate.release(ticket)
        if isinstance(exc, KernelRequestError):
            return refusal(exc.code, str(exc))
        held.lost = f"its sandbox failed during a {request.op} ({exc})"
        return refusal("session_lost", held.lost)
    entry = None
    if request.op == "fork":
        result = _forked(worker, done, tickets)
    else:
        held.epoch = done["epoch"]
        entry = worker.session_entry(session_id, held.epoch)
        result = dict(done)
    event = branch_event(done)
    events = worker.journal.entries(session_id, event.exec_id, [event.model_dump_json()], None)
    error = worker.registry.finish_branch(result, entry, events, reply.encode if reply else None)
    if reply is not None:
        reply.stored()
    if error:
        log.warning("session %s: the journal missed a %s (%s)", session_id, request.op, error)
    log.info("session %s: %s on worker %s", session_id, request.op, worker.id)
    return result


def _room(worker: WorkerHost, n: int) -> list[Ticket] | None:
    """Room at the worker's gate for ``n`` boxes of the defaults (a fork's box has its
    parent's limits; the kernel's own admission counts them exactly), or ``None``."""
    tickets: list[Ticket] = []
    box_weight = weight(None, worker.box_defaults())
    for _ in range(n):
        ticket = worker.gate.open(box_weight, FORK_ROOM_WAIT_S)
        if ticket is None:
            for taken in tickets:
                worker.gate.release(taken)
            return None
        tickets.append(ticket)
    return tickets


def _forked(worker: WorkerHost, reply: Branched, tickets: list[Ticket]) -> dict[str, Any]:
    """Hold the forks here like opened sessions (each with its room), and say where they are."""
    forks = reply.get("forks", [])
    for forked, ticket in zip(forks, tickets, strict=False):
        worker.hold(forked["session_id"], forked["epoch"], ticket)
    for ticket in tickets[len(forks) :]:
        worker.gate.release(ticket)
    where = {"worker": worker.id, "generation": worker.generation, "queue": worker.queue}
    return {**reply, **where}
