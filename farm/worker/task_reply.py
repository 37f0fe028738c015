"""``TaskReply``: a task's Celery result, written by the worker's own end-of-call script.

A cell's end already costs one script (journal, record, session: ``farm.events.exec_finish``);
Celery's own store of the result would cost two more round trips (a GET, then SETEX+PUBLISH).
The script writes and publishes the same bytes Celery would (its backend's meta and encoding),
after the record; then the task's request says its result is stored, and Celery skips its own.
Why: docs/design/events-and-journal.md ("The end of a call").
"""

from __future__ import annotations

from typing import Any

from celery import states
from celery.backends.redis import RedisBackend


class TaskReply:
    """The result of one running Celery task (``task`` is the bound task, while it runs)."""

    def __init__(self, task: Any) -> None:
        self.backend = task.backend
        self.request = task.request
        self.task_id = str(self.request.id)

    def encode(self, result: dict[str, Any]) -> tuple[str, str, int]:
        """``result`` as Celery's backend stores it: (key, encoded meta, TTL in s)."""
        backend = self.backend
        meta = backend._get_result_meta(
            result=result, state=states.SUCCESS, traceback=None, request=self.request
        )
        meta["task_id"] = self.task_id
        key = backend.get_key_for_task(self.task_id)
        key = key.decode() if isinstance(key, bytes) else str(key)
        expires = backend.expires
        return key, str(backend.encode(meta)), int(expires) if expires else 0

    def stored(self) -> None:
        """The result is stored and published: Celery must not store it again."""
        self.request.ignore_result = True


def replying(task: Any) -> TaskReply | None:
    """A ``TaskReply`` for ``task`` when its result goes to a Redis backend that a script can
    write, the worker's broker (else ``None``: Celery stores it, as for any task)."""
    request = task.request
    if not isinstance(task.backend, RedisBackend) or request.id is None or request.is_eager:
        return None
    if request.ignore_result or request.chord:  # nothing to store, or more than a store
        return None
    return TaskReply(task)
