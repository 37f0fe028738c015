"""A ``branch`` request (``wire.branch_frames``), checked and sent to what does it: checkpoints,
rollbacks and drops (``checkpoints``), forks (``session_forks``). Design: docs/design/fork.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..wire.branch_frames import Branched
from . import session_forks
from .links import RequestError
from .requests import wait

if TYPE_CHECKING:
    from .manager import SessionManager


async def branch(manager: SessionManager, message: dict[str, Any]) -> Branched:
    """A ``branch`` request, checked, then done (``fork``: ``session_forks``)."""
    op, session_id = message.get("op"), message.get("session_id")
    if not isinstance(session_id, str):
        raise RequestError("bad_request", "field 'session_id' must be a string")
    checkpoint_id = message.get("checkpoint_id")
    if op in ("rollback", "drop") and not isinstance(checkpoint_id, str):
        raise RequestError("bad_request", "field 'checkpoint_id' must be a string")
    if op == "checkpoint":
        return await manager.checkpoints.take(session_id)
    keep = message.get("keep", True)
    if not isinstance(keep, bool):
        raise RequestError("bad_request", "field 'keep' must be a boolean")
    if op == "rollback":
        return await manager.checkpoints.rollback(session_id, str(checkpoint_id), keep)
    if op == "drop":
        return manager.checkpoints.drop(session_id, str(checkpoint_id))
    if op == "fork":
        n = message.get("n", 1)
        if not isinstance(n, int) or isinstance(n, bool):
            raise RequestError("bad_request", "field 'n' must be an integer")
        return await session_forks.fork(manager, session_id, n, wait(message))
    raise RequestError("bad_request", f"unknown branch op {op!r}")
