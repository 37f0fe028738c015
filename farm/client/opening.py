"""Opening a session: the request waits in its image's list of opens until a worker has room.

An open (``OpenRequest``) is queued on ``farm.<image>.opens``; the worker that takes it claims
its ``open_id`` first and answers on the client's own list of answers (``Answers``: one list and
one reading thread per client, so a thousand opens waiting hold one connection, not a thousand).
A client that gives up at its deadline abandons the id (claims it for nobody: a worker that
takes the request later opens nothing) and takes its request back out of the list; one whose
worker dies after claiming it is an open that will never be answered: asked again. Design:
docs/design/admission.md.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from farm.broker_errors import BROKER_DOWN
from farm.client.broker import Broker
from farm.client.hostcall_handlers import Callbacks
from farm.egress.policy import PolicyError, parse_rules
from farm.errors import BrokerLost, InvalidRequest
from farm.models import BoxLimits, Busy, Opened, OpenRequest, Refused
from farm.registry import Registry, answers_key, opens_key

ANSWER_SLICE_S = 1.0  # between two looks at an open's claim and the broker's mark
ANSWER_GRACE_S = 60.0  # a worker that claimed an open answers within this of its deadline
Answer = Opened | Busy | Refused


class Answers:
    """The answers to one client's opens: one Redis list (``answers_key``), read by one thread
    while opens wait, each answer handed to the open it names."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.key = answers_key(uuid.uuid4().hex)
        self._waiting: dict[str, queue.SimpleQueue[Answer]] = {}
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._closed = False

    def expect(self, open_id: str) -> queue.SimpleQueue[Answer]:
        """Where the answer to ``open_id`` will come (``forget`` it once done)."""
        box: queue.SimpleQueue[Answer] = queue.SimpleQueue()
        with self._lock:
            self._waiting[open_id] = box
            if self._reader is None:
                self._reader = threading.Thread(target=self._read, name="farm-answers", daemon=True)
                self._reader.start()
        return box

    def forget(self, open_id: str) -> None:
        with self._lock:
            self._waiting.pop(open_id, None)

    def close(self) -> None:
        """Stop reading (the client closes): its reader ends within ``ANSWER_SLICE_S``."""
        with self._lock:
            self._closed = True
            reader = self._reader
        if reader is not None:
            reader.join(ANSWER_SLICE_S + 5.0)

    def _read(self) -> None:
        """Hand out answers while opens wait (an answer to an open no longer waited for is
        dropped: its client heard busy, or the worker's claim had won and it was read)."""
        while True:
            with self._lock:
                if not self._waiting or self._closed:
                    self._reader = None
                    return
            try:
                raw = self.registry.wait_answer(self.key, ANSWER_SLICE_S)
            except BROKER_DOWN:  # each waiting open watches the broker itself
                time.sleep(ANSWER_SLICE_S)  # the outage's pause, not a readiness wait
                continue
            if raw is None:
                continue
            message = json.loads(raw)
            with self._lock:
                box = self._waiting.get(str(message.get("open_id")))
            if box is not None:
                box.put(_answer(message["answer"]))


def open_once(
    broker: Broker,
    answers: Answers,
    image_queue: str,
    fields: dict[str, Any],
    deadline: float,
) -> Answer:
    """Queue one open on ``image_queue``'s list (``fields``: its tools, limits and egress) and
    wait for its answer until ``deadline`` (monotonic); busy when no worker took it by then (it
    is abandoned and taken back), or when the worker that took it died."""
    registry = answers.registry
    open_id = uuid.uuid4().hex
    left = max(deadline - time.monotonic(), 0.0)
    request = OpenRequest(
        open_id=open_id,
        reply=answers.key,
        sent_at=time.time(),
        deadline=time.time() + left,
        **fields,
    )
    body, key = request.model_dump_json(), opens_key(image_queue)
    mark = broker.call(registry.broker_mark, sent=False)
    box = answers.expect(open_id)
    try:
        broker.call(lambda: registry.push_open(key, body), sent=False)
        while True:
            try:
                return box.get(timeout=ANSWER_SLICE_S)
            except queue.Empty:
                pass
            why = broker.call(lambda: _unanswerable(broker, registry, request, mark), sent=True)
            if why is not None:
                return Busy(reason=why)
            if time.monotonic() > deadline:
                if broker.call(lambda: registry.abandon(open_id), sent=True):
                    broker.quietly(lambda: registry.take_back(key, body))
                    return Busy(reason=f"no worker had room for it within {left:.0f} s")
                if time.monotonic() > deadline + ANSWER_GRACE_S:  # claimed, never answered
                    return Busy(reason="the worker that took it did not answer")
    finally:
        answers.forget(open_id)


def _unanswerable(
    broker: Broker, registry: Registry, request: OpenRequest, mark: str
) -> str | None:
    """Why ``request`` will never be answered: the broker lost its data, or the worker that
    claimed it is gone; ``None`` while it may be."""
    if registry.broker_mark() != mark:
        raise BrokerLost("the broker lost its data while a session open waited")
    record = registry.exec_record(request.open_id)
    if record is None or record.get("state") != "running":
        return None
    owner = (str(record["worker"]), int(record["generation"]))
    if broker.after_outage(lambda: registry.worker_alive(*owner), bool):
        return None
    return f"worker {owner[0]} (generation {owner[1]}) died while it opened the session"


def _answer(data: dict[str, Any]) -> Answer:
    if data.get("refused"):
        return Refused.model_validate(data)
    return Busy.model_validate(data) if data.get("busy") else Opened.model_validate(data)


def limits_field(limits: BoxLimits | Mapping[str, int] | None) -> dict[str, int] | None:
    """The box limits a request carries (checked here: a typo fails before anything is sent)."""
    if limits is None:
        return None
    try:
        checked = limits if isinstance(limits, BoxLimits) else BoxLimits.model_validate(limits)
    except ValueError as exc:
        raise InvalidRequest(f"bad box limits: {exc}") from None
    return checked.model_dump() or None


def egress_field(egress: Sequence[str] | None) -> list[str] | None:
    """The egress rules a request carries (their syntax checked here; the ceiling by the
    worker, whose operator sets it)."""
    if egress is None:
        return None
    if isinstance(egress, str):
        raise InvalidRequest("egress takes a list of host patterns, not one string")
    try:
        return [str(rule) for rule in parse_rules(egress)] or None
    except PolicyError as exc:
        raise InvalidRequest(str(exc)) from None


def callbacks_field(
    functions: Mapping[str, Callable[..., Any]] | None,
    max_depth: int,
    max_calls: int,
    timeout_s: float,
) -> Callbacks | None:
    if not functions:
        return None
    return Callbacks(functions, max_depth=max_depth, max_calls=max_calls, timeout_s=timeout_s)
