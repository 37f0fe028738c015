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
import uuid
from typing import Any

from farm.events.journal import Entries, Journal
from farm.events.run_events import (
    Branch,
    Display,
    Egress,
    Event,
    ExecStart,
    Result,
    Stream,
    clip,
    closing_events,
)
from farm.kernel.wire.branch_frames import Branched
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

    def _slim(self, event: Event, whole: str) -> str:
        """The event as the journal keeps it, as JSON (``whole``: all of it): whole while the
        run's byte budget lasts, then outputs as bounded text (the live stream still gets them
        whole)."""
        size = len(whole)
        if size <= self.budget or not isinstance(event, Display | Result | Stream):
            self.budget -= size
            return whole
        if isinstance(event, Stream):
            cut = f"[... {len(event.text)} characters not journaled: the run's budget is spent]\n"
            return event.model_copy(update={"text": cut}).model_dump_json()
        text = clip(event.value.text, 2000)
        value = Value(text=text, data={"text/plain": text})
        return event.model_copy(update={"value": value}).model_dump_json()

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
        entries = self._entries(events)
        if entries is None:
            return
        try:
            self.journal.add(entries)
        except Exception as exc:
            self._not_published(exc)

    def _entries(self, events: list[Event]) -> Entries | None:
        """``events`` (after those held back) as the journal's and live stream's entries, each
        event encoded once."""
        events, self.held = self.held + events, []
        if not events:
            return None
        whole = [event.model_dump_json() for event in events]
        journaled = [self._slim(event, row) for event, row in zip(events, whole, strict=True)]
        request = self.request
        return self.journal.entries(
            request.session_id, request.exec_id, journaled, whole if self.live else None
        )

    def _not_published(self, exc: object) -> None:
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
        entries = self.close(result)
        if entries is not None:
            try:
                self.journal.add(entries)
            except Exception as exc:
                self._not_published(exc)

    def close(self, result: dict[str, Any]) -> Entries | None:
        """The run's result is known: its last events, for the caller to write (with the
        run's record: ``Registry.finish_exec``; then ``published``). No event comes after."""
        with self._lock:
            self.ended = True
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
            return self._entries(events + closing)

    def published(self, error: str) -> None:
        """What writing ``close``'s entries said: an error is logged, never raised."""
        if error:
            self._not_published(error)


def branch_event(reply: Branched) -> Branch:
    """A branch op's event in the session's journal (from the kernel's reply): a replay after
    a loss of state then knows which cells a rollback undid (``journal_replay.live_cells``)."""
    return Branch(
        exec_id=uuid.uuid4().hex,
        session_id=reply["session_id"],
        seq=0,
        ts=time.time(),
        op=reply["op"],
        epoch=reply["epoch"],
        checkpoint_id=reply.get("checkpoint_id"),
        forks=[forked["session_id"] for forked in reply.get("forks", [])],
    )
