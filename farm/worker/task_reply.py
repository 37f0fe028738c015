"""``TaskReply``: a task's Celery result, written by the worker's own end-of-call script.

A cell's end already costs one script (journal, record, session: ``farm.events.exec_finish``);
Celery's own store of the result would cost two more round trips (a GET, then SETEX+PUBLISH).
The script writes and publishes the meta Celery would (JSON, for a task of no group, parent or
extended result), after the record and around the record's own encoding of the result; then
the task's request says its result is stored, and Celery skips its own.
Why: docs/design/events-and-journal.md ("The end of a call").
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Protocol

from celery import Celery, states
from celery.backends.redis import RedisBackend
from redis.exceptions import RedisError

from farm.events.exec_finish import Reply


class Replier(Protocol):
    """Where a call's result goes (``TaskReply``, ``farm.worker.run_lane.LaneReply``): the
    end-of-call script writes ``encode``'s reply, then ``stored`` says it was."""

    def encode(self, result: str) -> Reply: ...

    def stored(self) -> None: ...


class TaskReply:
    """The result of one running Celery task (``task`` is the bound task, while it runs)."""

    def __init__(self, task: Any) -> None:
        self.app = task.app
        self.backend = task.backend
        self.request = task.request
        self.task_id = str(self.request.id)

    def encode(self, result: str) -> Reply:
        """``result`` (its JSON, as the record holds it) as Celery's backend stores it: (key,
        encoded meta, TTL in s); the meta's fields as ``Backend._get_result_meta`` makes them."""
        backend = self.backend
        key = backend.get_key_for_task(self.task_id)
        key = key.decode() if isinstance(key, bytes) else str(key)
        done = json.dumps(self.app.now().isoformat())
        meta = (
            f'{{"status": "{states.SUCCESS}", "result": {result}, "traceback": null, '
            f'"children": [], "date_done": {done}, "task_id": {json.dumps(self.task_id)}}}'
        )
        expires = backend.expires
        return Reply(key, meta, int(expires) if expires else 0)

    def stored(self) -> None:
        """The result is stored and published: Celery must not store it again."""
        self.request.ignore_result = True


def replying(task: Any) -> TaskReply | None:
    """A ``TaskReply`` for ``task`` when its result goes to a Redis backend that a script can
    write, the worker's broker (else ``None``: Celery stores it, as for any task)."""
    request, backend = task.request, task.backend
    if not isinstance(backend, RedisBackend) or request.id is None or request.is_eager:
        return None
    if request.ignore_result or request.chord or request.group or request.parent_id:
        return None  # nothing to store, or more than a store
    if backend.serializer != "json" or task.app.conf.result_extended:
        return None  # a meta of other bytes, or of more fields
    return TaskReply(task)


def warm_backend(app: Celery) -> None:
    """Make ``app``'s result backend and its first connection now, while the sandbox starts:
    Celery looks its class up among every installed package's entry points (~10 ms), and the
    first call's result would wait for both. The worker app's backend is one for all its
    threads (``result_backend_thread_safe``: redis-py's pool is), not one each."""
    backend = app.backend
    if isinstance(backend, RedisBackend):
        with contextlib.suppress(RedisError, OSError):  # a broker down now: the start says so
            backend.client.ping()
