"""``ExecRecorder``: one run's kernel events and result turned into typed events, published.

Each event is numbered and published as it comes (the session's journal, and the run's stream
when the caller streams it); the end adds ``Result``/``Error``/``ExecEnd`` from the result.
Invariants: every run has a complete record, even one that never reached the kernel; publishing
is best effort and never fails the run. Why ``ExecStart`` is held back:
docs/design/events-and-journal.md.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from farm.events.journal import Journal
from farm.events.run_events import (
    Display,
    Egress,
    Event,
    ExecStart,
    Result,
    Stream,
    clip,
    closing_events,
)
from farm.kernel.wire.protocol import CellEvent
from farm.models import ExecRequest, Value
from farm.worker.hostcalls import HostCalls

log = logging.getLogger(__name__)


class ExecRecorder:
    def __init__(self, journal: Journal, request: ExecRequest, worker_id: str) -> None:
        self.journal = journal
        self.request = request
        self.worker_id = worker_id
        self.live = request.stream
        self.seq = 0
        self.started = False  # the kernel said the code started
        self.held: list[Event] = []  # ExecStart, until something else is published
        self.budget = journal.exec_max_bytes
        self.calls = HostCalls(journal.redis, request, self.live)
        self.ended = False
        # Egress records come from the proxy's thread (``egress``); the rest from the run's.
        self._lock = threading.RLock()

    def _common(self) -> dict[str, Any]:
        with self._lock:
            return self._next()

    def _next(self) -> dict[str, Any]:
        fields = {
            "exec_id": self.request.exec_id,
            "session_id": self.request.session_id,
            "seq": self.seq,
            "ts": time.time(),
        }
        self.seq += 1
        return fields

    def _start(self) -> ExecStart:
        return ExecStart(
            **self._common(),
            code=self.request.code,
            epoch=self.request.epoch,
            worker=self.worker_id,
            replay_of=self.request.replay_of,
        )

    def _slim(self, event: Event) -> Event:
        """The event as the journal keeps it: whole while the run's byte budget lasts, then
        outputs as bounded text (the live stream still gets them whole)."""
        size = len(event.model_dump_json())
        if size <= self.budget or not isinstance(event, Display | Result | Stream):
            self.budget -= size
            return event
        if isinstance(event, Stream):
            cut = f"[... {len(event.text)} characters not journaled: the run's budget is spent]\n"
            return event.model_copy(update={"text": cut})
        text = clip(event.value.text, 2000)
        return event.model_copy(update={"value": Value(text=text, data={"text/plain": text})})

    def egress(self, fields: dict[str, Any]) -> bool:
        """A connection of the run's box ended (``Egress`` fields); ``False`` once the run's
        record is closed (the caller journals it on its own)."""
        with self._lock:
            if self.ended:
                return False
            self._publish([Egress(**self._common(), **fields)])
            return True

    def _publish(self, events: list[Event]) -> None:
        with self._lock:
            self._publish_locked(events)

    def _publish_locked(self, events: list[Event]) -> None:
        events, self.held = self.held + events, []
        if not events:
            return
        try:
            journaled = [self._slim(event) for event in events]
            self.journal.append(journaled, events if self.live else None)
        except Exception as exc:
            log.warning(
                "exec %s of session %s on worker %s: events not published: %s",
                self.request.exec_id,
                self.request.session_id,
                self.worker_id,
                exc,
            )

    def on_kernel_event(self, event: CellEvent) -> dict[str, Any] | None:
        """One kernel event of the running cell (called in order, on the worker's thread);
        for a host ``call``, the answer to send back."""
        kind = event["type"]
        try:
            if event["type"] == "call":
                return self.calls.answer(event, self._publish, self._common)
            if event["type"] == "started":
                self.started = True
                self.held = [self._start()]
            elif event["type"] == "running":
                self._publish([])
            elif event["type"] == "stream":
                self._publish([Stream(**self._common(), name=event["name"], text=event["text"])])
            elif event["type"] == "display":
                value = Value.model_validate(event["value"])
                self._publish([Display(**self._common(), value=value)])
        except (KeyError, TypeError, ValueError) as exc:  # a malformed event is dropped
            log.warning("exec %s: bad kernel event %r: %s", self.request.exec_id, kind, exc)
            if kind == "call":  # the cell waits for an answer: never leave it hanging
                return {"ok": False, "error": {"ename": "CallbackError", "evalue": "bad call"}}
        return None

    def finish(self, result: dict[str, Any]) -> None:
        """The run's result is known: close its record (after this, the task returns)."""
        with self._lock:
            self.ended = True
            self._finish(result)

    def _finish(self, result: dict[str, Any]) -> None:
        if self.calls.records:
            result["sub_calls"] = [c.model_dump(mode="json") for c in self.calls.records]
        events: list[Event] = [] if self.started else [self._start()]
        worker = result.get("worker") or self.worker_id
        closing = closing_events(
            {**result, "worker": worker},
            exec_id=self.request.exec_id,
            session_id=self.request.session_id,
            seq=self.seq,
            ts=time.time(),
            ran=self.started,
        )
        self.seq += len(closing)
        self._publish(events + closing)
