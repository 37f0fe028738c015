"""Sessions that branch, as the caller holds them: checkpoint, rollback, drop, fork.

One request path for all four (``TASK_BRANCH`` to the session's worker), built here alone;
``Session`` and ``AsyncSession`` have thin methods over these functions. A refusal raises its
typed error (``farm.errors.error_for_branch``: too many checkpoints, unknown checkpoint,
budget exceeded) and leaves the session as it was. Design: docs/design/fork.md.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Protocol, TypeVar

from farm.celeryconf import TASK_BRANCH
from farm.client.broker import Watch
from farm.client.exec_call import Placed
from farm.errors import error_for_branch
from farm.models import BranchRequest, Opened
from farm.models.branches import Checkpoint

BRANCH_WAIT_S = 600.0  # queueing at the worker, then the kernel's own deadline (two minutes)
S = TypeVar("S")
BranchOp = Literal["checkpoint", "rollback", "drop", "fork"]


class Branching(Placed, Protocol):
    """A session as its branching sees it: where it lives, and its liveness check."""

    @property
    def generation(self) -> int: ...

    @property
    def queue(self) -> str: ...

    def _check_alive(self) -> str: ...


def request(session: Branching, op: BranchOp, **fields: Any) -> dict[str, Any]:
    """Send one branch op to the session's worker and wait for its reply; raise its error."""
    message = BranchRequest(
        op=op, session_id=session.id, generation=session.generation, **fields
    ).model_dump(mode="json")
    pending, mark = session.farm.broker.send(
        TASK_BRANCH, session.queue, args=[message], check=session._check_alive
    )
    watch = Watch((session.worker, session.generation), None, mark, session.id)
    reply: dict[str, Any] = session.farm.broker.wait(
        pending, time.monotonic() + BRANCH_WAIT_S, watch
    )
    error = reply.get("error")
    if error:
        raise error_for_branch(session.id, str(error["code"]), str(error["message"]))
    return reply


def checkpoint(session: Branching) -> Checkpoint:
    reply = request(session, "checkpoint")
    return Checkpoint(
        id=reply["checkpoint_id"],
        session_id=session.id,
        epoch=reply["epoch"],
        files=reply.get("files", 0),
        bytes=reply.get("bytes", 0),
    )


def checkpoint_id(cp: Checkpoint | str) -> str:
    return cp.id if isinstance(cp, Checkpoint) else cp


def rollback(session: Branching, cp: Checkpoint | str, keep: bool = True) -> int:
    """Back to ``cp``; the session's new epoch (a call sent before, at the old one, is refused
    as ``state_lost`` rather than run in the restored namespace). ``keep=False`` spends the
    checkpoint (one fork less: the held copy itself goes on as the session)."""
    reply = request(session, "rollback", checkpoint_id=checkpoint_id(cp), keep=keep)
    return int(reply["epoch"])


def drop(session: Branching, cp: Checkpoint | str) -> None:
    request(session, "drop", checkpoint_id=checkpoint_id(cp))


class Forks(list[S]):
    """The sessions a fork made (in order), and what of the parent none of them holds:
    ``not_carried``, ``"name: why"`` each (docs/design/fork.md)."""

    def __init__(self, sessions: list[S], not_carried: list[str]) -> None:
        super().__init__(sessions)
        self.not_carried = not_carried


def fork(session: Branching, n: int = 1) -> tuple[list[Opened], list[str]]:
    """Where the ``n`` new sessions are (each a box of its own, holding the session's files
    and variables as they are now, by value), and what they lack."""
    reply = request(session, "fork", n=n)
    opened = [
        Opened(
            session_id=forked["session_id"],
            epoch=forked["epoch"],
            worker=reply["worker"],
            generation=reply["generation"],
            queue=reply["queue"],
        )
        for forked in reply["forks"]
    ]
    return opened, [str(name) for name in reply.get("not_carried", [])]
