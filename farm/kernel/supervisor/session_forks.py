"""Forks of a session into boxes of their own, by value (``session.fork(n)``).

Each fork is an ordinary session (``manager.open``: a new box number, uid, namespaces, disk and
budgets, admitted like any open) into which the parent's state is loaded: the parent exports
it between cells (``repl.state_export``), bytes cross through the supervisor, each fork loads
them. No process of the parent's crosses, so the co-tenancy of boxes holds between a parent and
its forks and between forks. Invariants: all n forks or none (a fork that fails closes those
made); the parent's lock is held only while it exports. Design: docs/design/fork.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from ..wire.branch_frames import Branched, Forked
from .held_answers import ask
from .links import RequestError

if TYPE_CHECKING:
    from .manager import SessionManager

MAX_FORKS = 64  # per request: more is a loop of requests, each admitted like the rest
ROOM_CODES = ("too_many_sessions", "bad_limits")  # no room for the forks: a budget refusal


async def fork(manager: SessionManager, session_id: str, n: int, wait_s: float) -> Branched:
    if not 1 <= n <= MAX_FORKS:
        raise RequestError("budget_exceeded", f"a fork makes 1 to {MAX_FORKS} sessions, not {n}")
    t0 = time.perf_counter()
    parent = manager.session(session_id)
    async with parent.lock:
        if parent.proc.exit is not None:
            raise RequestError("unavailable", "the session process is gone: run a cell first")
        exported = await ask(parent.proc, {"type": "export"})
    if not isinstance(exported.get("blob"), bytes):
        code = "budget_exceeded" if exported.get("budget") else "unavailable"
        raise RequestError(
            code, f"the session's state could not be exported: {exported.get('error')}"
        )
    made = await asyncio.gather(
        *(_one(manager, parent.tools, dict(parent.box.limits), exported["blob"], wait_s)
          for _ in range(n)),
        return_exceptions=True,
    )  # fmt: skip
    forks = [m for m in made if isinstance(m, tuple)]
    failed = [m for m in made if not isinstance(m, tuple)]
    if failed:
        for forked, _ in forks:
            with contextlib.suppress(RequestError):
                manager.close(forked["session_id"])
        error = failed[0]
        if isinstance(error, RequestError) and error.code in ROOM_CODES:
            raise RequestError("budget_exceeded", f"no room for {n} forks: {error}")
        raise error
    lost = _names(exported.get("not_carried"))
    for _, missing in forks:
        lost += [name for name in missing if name not in lost]
    return {
        "type": "branched",
        "op": "fork",
        "session_id": parent.id,
        "epoch": parent.epoch,
        "checkpoints": manager.checkpoints.count(parent.id),
        "forks": [forked for forked, _ in forks],
        "not_carried": lost,
        "duration_s": time.perf_counter() - t0,
    }


async def _one(
    manager: SessionManager, tools: bool, limits: dict[str, Any], state: bytes, wait_s: float
) -> tuple[Forked, list[str]]:
    """One fork: a session opened, the state loaded; closed again when the load fails."""
    opened = await manager.open(tools, limits, wait_s=wait_s)
    child = manager.session(opened["session_id"])
    async with child.lock:
        loaded = await ask(child.proc, {"type": "import", "blob": state})
    if "error" in loaded or loaded.get("type") != "imported":
        with contextlib.suppress(RequestError):
            manager.close(child.id)
        raise RequestError("unavailable", f"a fork could not load the state: {loaded.get('error')}")
    forked: Forked = {"session_id": child.id, "epoch": child.epoch}
    return forked, _names(loaded.get("not_carried"))


def _names(field: Any) -> list[str]:
    """What a session process said was not carried (its code may have written the frame)."""
    return [str(name)[:500] for name in field[:1000]] if isinstance(field, list) else []
