"""The run lane: a session's plain runs travel as Redis lists, not as Celery tasks.

A client pushes an ``ExecRequest`` on its worker generation's lane (``lane_key`` of its direct
queue) and blocks on the call's reply list (``reply_key``); the worker's ``RunLane`` pops it,
runs it as the ``farm.exec`` task would (the claim, the session's checks) and its end-of-call
script pushes the result. Two commands each way, where Celery's machinery cost ~6x a bare
list's CPU and wall time a call. Invariants: both lists expire (a lane no worker pops, a reply
no client reads); a reply list holds results of its exec id only. Why: docs/design/run-lane.md.
"""

from __future__ import annotations

import json
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout

from farm.registry import EXEC_TTL_S, PREFIX, Registry

# A lane left behind by its worker generation (it stopped with calls queued) expires; its
# clients have seen the worker gone by then (their watch, between two waits).
LANE_TTL_S = EXEC_TTL_S
REPLY_TTL_S = EXEC_TTL_S  # as Celery's results: a reply no client read expires
FAILED = "__lane_failed__"  # a reply's key when the worker's own code failed the call


def lane_key(queue: str) -> str:
    """The run lane of the worker generation whose direct queue is ``queue``."""
    return f"{PREFIX}lane:{queue}"


def reply_key(exec_id: str) -> str:
    """The list a call's result is pushed on."""
    return f"{PREFIX}reply:{exec_id}"


def push_run(registry: Registry, queue: str, body: str) -> None:
    """Queue a run (an ``ExecRequest``'s JSON) on ``queue``'s lane."""
    registry.answer(lane_key(queue), body, LANE_TTL_S)


def push_reply(registry: Registry, exec_id: str, body: str) -> None:
    """Push a reply the end-of-call script did not (a call refused or lost before it ran)."""
    registry.answer(reply_key(exec_id), body, REPLY_TTL_S)


class LanePending:
    """A run sent on a lane, as ``Broker.wait`` waits for a Celery task's: ``get`` a slice at a
    time (``CeleryTimeout`` when nothing came), ``ready``, ``forget``; no result backend."""

    backend = None  # nothing subscribed: ``release`` has nothing to let go

    def __init__(self, registry: Registry, exec_id: str) -> None:
        self.registry = registry
        self.exec_id = exec_id
        self._reply: dict[str, Any] | None = None

    def get(self, timeout: float, propagate: bool = True) -> dict[str, Any]:
        if self._reply is None:
            popped = self.registry.wait_answer(reply_key(self.exec_id), timeout)
            if popped is None:
                raise CeleryTimeout(f"no reply to run {self.exec_id} yet")
            self._reply = json.loads(popped)
        reply = self._reply
        if FAILED in reply and propagate:
            raise LaneCallFailed(str(reply[FAILED]))
        return reply

    def ready(self) -> bool:
        if self._reply is None:
            popped = self.registry.redis.lpop(reply_key(self.exec_id))
            if popped is not None:
                self._reply = json.loads(str(popped))
        return self._reply is not None

    def forget(self) -> None:
        """Nothing to forget: a reply is popped as it is read, an unread one expires."""


class LaneCallFailed(Exception):
    """The worker's own code failed a call of the lane (as a Celery task that raised)."""
