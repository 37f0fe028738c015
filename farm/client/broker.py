"""The client's one path to the broker: send a task, wait for its answer, and ride out outages.

Invariants: an outage is waited out for ``broker_wait_s`` (then ``BrokerUnavailable``, whose
``sent`` says whether the call may have run); a broker that lost its data is ``BrokerLost``,
never retried; a resend carries the same exec id, so the worker's claim runs it once; a dead
worker is ``SessionLost`` within seconds (its heartbeat is watched). Why and how:
docs/design/delivery-and-fencing.md.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeout
from kombu.utils.url import maybe_sanitize_url

from farm.backoff import delays
from farm.broker_errors import BROKER_DOWN, REFUSED, refusal
from farm.errors import (
    BrokerAuthFailed,
    BrokerLost,
    BrokerUnavailable,
    FarmBusy,
    FarmError,
    SessionLost,
    WorkerFailed,
)
from farm.events.lanes import LanePending, push_run
from farm.registry import Registry

T = TypeVar("T")

# What makes a skippable broker call skip (``Broker.quietly``).
SKIPPABLE: tuple[type[BaseException], ...] = (*BROKER_DOWN, BrokerUnavailable, BrokerLost)
WAIT_SLICE_S = 0.5


def shown(value: list[Any] | dict[str, Any] | None) -> str:
    """What a task message shows of its arguments (Celery's ``argsrepr`` and ``kwargsrepr``, in
    its headers, the worker's log and task events): the ids in them, never a cell's code or
    data. Celery would build a ``saferepr`` of up to 1 kB instead, ~66 us of CPU a request."""
    found = value.values() if isinstance(value, dict) else value or []
    ids = [
        f"{key}={item}"
        for arg in found
        if isinstance(arg, dict)
        for key, item in arg.items()
        if key.endswith("_id") and isinstance(item, str)
    ]
    return f"({', '.join(ids)})"


@dataclass(frozen=True)
class Watch:
    """What a waiting call watches between slices of waiting: the worker running it (known
    for a session call; else found from ``exec_id``'s claim record) and the broker's mark;
    ``session_id`` names the session in what a loss raises."""

    worker: tuple[str, int] | None = None
    exec_id: str | None = None
    mark: str | None = None
    session_id: str | None = None


class Broker:
    """Sends and waits for one ``Farm``; ``wait_s`` is how long an outage is waited out."""

    def __init__(
        self, app: Celery, registry: Registry, url: str, wait_s: float, grace_s: float
    ) -> None:
        self.app = app
        self.registry = registry
        self.url = maybe_sanitize_url(url)  # never print a password
        self.wait_s = wait_s
        self.grace_s = grace_s  # how long after an outage a lapsed heartbeat may come back
        self._down_at = -float("inf")  # when this client last found the broker down

    def send(
        self,
        name: str,
        queue: str,
        *,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        check: Callable[[], str] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, str]:
        """Send task ``name`` to ``queue`` after ``check`` (default: read the broker mark),
        which returns the mark the wait compares against; returns ``(pending, mark)``.
        ``options`` go to Celery's ``send_task`` (``ignore_result``: nothing waits for it)."""

        def attempt() -> tuple[Any, str]:
            mark = check() if check is not None else self.registry.broker_mark()
            pending = self.app.send_task(
                name,
                args=args,
                kwargs=kwargs,
                queue=queue,
                argsrepr=shown(args),
                kwargsrepr=shown(kwargs),
                **(options or {}),
            )
            return pending, mark

        return self.call(attempt, sent=False)

    def push_run(
        self, queue: str, request: dict[str, Any], *, check: Callable[[], str]
    ) -> tuple[LanePending, str]:
        """``send`` of a session's plain run on the run lane of ``queue``'s worker generation
        (``farm.events.lanes``), not as a Celery task; a copy pushed twice after an outage runs once
        (the worker's claim)."""
        body = json.dumps(request)

        def attempt() -> tuple[LanePending, str]:
            mark = check()
            push_run(self.registry, queue, body)
            return LanePending(self.registry, str(request["exec_id"])), mark

        return self.call(attempt, sent=False)

    def queue_chunk(self, queue: str, body: str) -> tuple[int, int]:
        """Queue a map chunk (a ``Chunk``'s JSON) on list ``queue`` (``registry.chunks_key``),
        where a worker with room takes it: its place in the list and the list's taken count
        then (``Registry.push_chunk``). A copy queued twice after an outage runs once (claims)."""
        return self.call(lambda: self.registry.push_chunk(queue, body), sent=False)

    def call(self, fn: Callable[[], T], *, sent: bool, deadline: float | None = None) -> T:
        """``fn()``, again after an outage once the broker is back (within ``wait_s``, and
        ``deadline`` when given); ``fn`` must be safe to repeat when it raised."""
        until: float | None = None
        while True:
            try:
                return fn()
            except REFUSED as exc:
                refused = self._refusal(exc)
                if refused is not None:
                    raise refused from exc
                if not isinstance(exc, BROKER_DOWN):
                    raise
                if until is None:
                    until = time.monotonic() + self.wait_s
                    if deadline is not None:
                        until = min(until, deadline)
                self._down_at = time.monotonic()
                if not self._back_by(until):
                    raise BrokerUnavailable(self.url, exc, sent=sent) from exc

    def error(self, exc: BaseException, *, sent: bool) -> FarmError:
        """``broker_error`` for what this client's broker clients raised outside ``call``."""
        return self._refusal(exc) or BrokerUnavailable(self.url, exc, sent=sent)

    def _refusal(self, exc: BaseException) -> BrokerAuthFailed | None:
        """``refusal`` for this client's broker (which knows whether it gave a password)."""
        given = self.registry.redis.connection_pool.connection_kwargs.get("password")
        return refusal(exc, self.url, password=given is not None)

    def quietly(self, fn: Callable[[], T]) -> T | None:
        """``fn()`` for cleanup and extras that may be skipped (closing a session, deleting a
        run's stream, a manifest's details): a broker that is down, or lost its data, makes it
        ``None`` at once instead of an error or a wait."""
        try:
            return fn()
        except SKIPPABLE:
            return None

    def after_outage(self, read: Callable[[], T], ok: Callable[[T], bool]) -> T:
        """``read()``, read again until ``ok`` while a recent outage may explain why it is not:
        workers cannot heartbeat while the broker is down, so their registrations may have
        lapsed; a live worker writes its own (same generation) again within a beat or two.
        Recent: this client saw the broker down, or the broker started, within ``grace_s``."""
        value = read()
        if ok(value):
            return value
        started = time.monotonic() - self._uptime()
        until = max(self._down_at, started) + self.grace_s
        while not ok(value) and time.monotonic() < until:
            time.sleep(0.1)  # poll interval, bounded by grace_s after the outage
            value = read()
        return value

    def _uptime(self) -> float:
        try:
            return float(self.registry.redis.info("server")["uptime_in_seconds"])
        except (redis.ResponseError, KeyError, ValueError):  # INFO renamed or disabled
            return float("inf")

    def _back_by(self, until: float) -> bool:
        """Poll the broker with a ping until it answers (True) or ``until`` passes (False)."""
        for delay in delays(0.05, 1.0):
            try:
                if self.registry.redis.ping():
                    return True
            except REFUSED as exc:  # back, but no longer taking this client's credentials
                refused = self._refusal(exc)
                if refused is not None:
                    raise refused from exc
            left = until - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))  # backoff between pings, bounded by ``until``
        raise AssertionError("unreachable")

    def wait(
        self, pending: Any, deadline: float, watch: Watch, *, final: bool = True
    ) -> dict[str, Any]:
        """Wait for a task result, watching the worker that runs it and the broker's ``mark``
        (read before sending): a changed mark means the message is gone with the broker's
        data, and no answer will ever come. ``final=False``: the caller may wait again after
        the deadline (``FarmBusy``), so the result is still listened for then."""
        try:
            while True:
                reply = self.call(lambda: self._poll(pending), sent=True, deadline=deadline)
                if reply is not None:  # Celery stopped listening when it came: just let go
                    release(pending, unsubscribe=False)
                    return reply
                self.check(pending, deadline, watch)
        except FarmBusy:
            if final:
                release(pending)
            raise
        except BrokerUnavailable:
            release(pending, unsubscribe=False)
            raise
        except BaseException:
            release(pending)
            raise

    @staticmethod
    def _poll(pending: Any) -> dict[str, Any] | None:
        try:
            reply: dict[str, Any] = pending.get(timeout=WAIT_SLICE_S, propagate=True)
        except CeleryTimeout:
            return None
        except BROKER_DOWN:
            raise
        except RuntimeError as exc:  # Celery's result consumer gave up reconnecting (~20 s)
            if isinstance(exc.__cause__, BROKER_DOWN):
                raise exc.__cause__ from exc
            raise
        except Exception as exc:  # the task itself crashed on the worker
            pending.forget()
            raise WorkerFailed(f"the worker task failed: {type(exc).__name__}: {exc}") from exc
        pending.forget()
        return reply

    def check(self, pending: Any, deadline: float, watch: Watch) -> None:
        """Raise when a call can no longer be answered: its worker died, the broker lost its
        data, or the deadline passed (one check, between two slices of waiting)."""
        self.call(lambda: self._check(pending, deadline, watch), sent=True, deadline=deadline)

    def _check(self, pending: Any, deadline: float, watch: Watch) -> None:
        worker, exec_id, mark = watch.worker, watch.exec_id, watch.mark
        # first: a broker that lost its data lost the worker registrations too
        if mark is not None and self.registry.broker_mark() != mark:
            pending.forget()
            raise BrokerLost(
                f"the broker lost its data while call {exec_id or '?'} waited (a Redis "
                "restart without persistence?): it may or may not have run; check before "
                "running it again"
            )
        owner = worker
        if owner is None and exec_id is not None:
            record = self.registry.exec_record(exec_id)
            if record and record.get("state") == "running":
                owner = (str(record["worker"]), int(record["generation"]))
        if owner is not None and not self.after_outage(
            lambda: self.registry.worker_alive(*owner), bool
        ):
            pending.forget()
            call = f" while call {exec_id} waited" if exec_id else ""
            raise SessionLost(
                watch.session_id,
                owner[0],
                f"worker {owner[0]} (generation {owner[1]}) is gone{call}",
            )
        if time.monotonic() > deadline:
            pending.forget()
            raise FarmBusy("no answer before the deadline: the farm is overloaded or down")


def release(pending: Any, *, unsubscribe: bool = True) -> None:
    """Stop listening for ``pending``'s result now, not in its ``__del__``: Celery's would
    unsubscribe whenever the garbage collector gets to it, and raise there if the broker is
    down by then. With the broker down (``unsubscribe=False``) it only lets go: unsubscribing
    would block in Celery's reconnect loop, and the subscription died with the connection."""
    backend, pending.backend = pending.backend, None
    if backend is not None and unsubscribe:
        with contextlib.suppress(Exception):  # cleanup: never the error the caller sees
            backend.remove_pending_result(pending)
