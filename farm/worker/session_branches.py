"""A worker's checkpoints, rollbacks and forks of the sessions it holds (``TASK_BRANCH``).

Requests stay plain dicts, built and read in ``branch_request`` and ``branch`` alone (one place
to type them later). A rollback moves the session's epoch, written to the registry before the
answer, so that a call of the line left behind is refused as ``state_lost``. A refusal is
``{"error": {"code", "message"}}`` and the session lives on; the client raises its typed error
(``farm.errors.error_for_branch``). Design: docs/design/fork.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from farm.kernel.wire.branch_frames import Branch
from farm.kernel.wire.client import KernelError, KernelRequestError

if TYPE_CHECKING:
    from farm.worker.worker_state import Worker

log = logging.getLogger(__name__)

BRANCH_TIMEOUT_S = 120.0  # a checkpoint copies the box's files; a fork opens boxes


def branch_request(request: dict[str, Any]) -> Branch:
    """The kernel's ``branch`` frame for a client's request."""
    message: Branch = {"type": "branch", "op": request["op"], "session_id": request["session_id"]}
    if request.get("checkpoint_id") is not None:
        message["checkpoint_id"] = str(request["checkpoint_id"])
    return message


def refusal(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def branch(worker: Worker, request: dict[str, Any]) -> dict[str, Any]:
    """Do one branch op on a session held here: the kernel's ``branched`` reply, or why not."""
    held, why = worker.calls._held(request)
    if held is None:
        return refusal("session_lost", why)
    session_id = request["session_id"]
    try:
        with worker.kernel() as kernel:
            reply = kernel.branch(branch_request(request), BRANCH_TIMEOUT_S)
    except KernelRequestError as exc:
        return refusal(exc.code, str(exc))
    except KernelError as exc:
        held.lost = f"its sandbox failed during a {request['op']} ({exc})"
        return refusal("session_lost", held.lost)
    held.epoch = reply["epoch"]
    worker.registry.put_session(*worker.session_entry(session_id, held.epoch))
    log.info("session %s: %s on worker %s", session_id, request["op"], worker.id)
    return dict(reply)
