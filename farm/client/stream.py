"""``EventStream``: the live events of one run, as ``session.stream(code)`` yields them.

The worker writes a run's events to a Redis stream as the kernel sends them and this reads them
with ``XREAD BLOCK`` in short slices, checking the owning worker and the broker between slices
like ``Session.run`` does, within the same deadline. The run's ``ExecResult`` still comes back
through its task, so ``stream.result`` is exactly what ``run`` returns; events the worker could
not publish are rebuilt from it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from farm.client.broker import release
from farm.errors import BrokerUnavailable
from farm.events.run_events import Event, ExecEnd, ExecStart, HostCall, closing_events
from farm.models import CallAnswer, ExecResult

if TYPE_CHECKING:
    from farm.client.exec_call import Caller

BLOCK_MS = 250


class EventStream:
    """``for event in session.stream(code)``; afterwards ``.result`` holds the ``ExecResult``.

    Iterating sends the code (once). Events arrive in order while the code runs; the stream
    ends after ``ExecEnd``. Losses surface as ``run`` raises them (``SessionLost``,
    ``StateLost``), after the events that tell them.
    """

    def __init__(self, session: Caller, code: str, timeout_s: float | None, **kwargs: Any):
        self.session = session
        self.code = code
        self.timeout_s = timeout_s
        self.kwargs = kwargs
        self.result: ExecResult | None = None
        self._iter: Iterator[Event] | None = None

    def __iter__(self) -> Iterator[Event]:
        if self._iter is None:
            self._iter = self._events()
        return self._iter

    def __next__(self) -> Event:
        return next(iter(self))

    def _events(self) -> Iterator[Event]:
        session, farm = self.session, self.session.farm
        call = session.send(self.code, self.timeout_s, stream=True, **self.kwargs)
        exec_id = call.request.exec_id
        seen_start, seen_end, done, seq, after, calls = False, False, False, 0, "0", 0
        end = call.deadline

        def read(after: str, block_ms: int) -> tuple[str, list[Event]]:
            fetch = lambda: farm.journal.read_exec(exec_id, after, block_ms)  # noqa: E731
            return farm.broker.call(fetch, sent=True, deadline=end)

        try:
            while not (seen_end or done):
                after, events = read(after, BLOCK_MS)
                if not events and farm.broker.call(call.pending.ready, sent=True, deadline=end):
                    after, events = read(after, 1)
                    done = True  # the task is over: whatever was published is there
                for event in events:
                    seen_start |= isinstance(event, ExecStart)
                    seen_end |= isinstance(event, ExecEnd)
                    seq = event.seq + 1
                    if isinstance(event, HostCall):  # the cell waits: answer before yielding
                        answer = self._answer(event, calls)
                        farm.broker.call(
                            lambda: farm.journal.push_answer(exec_id, event.call_id, answer),  # noqa: B023
                            sent=True,
                            deadline=end,
                        )
                        calls += event.items
                    yield event
                if not (seen_end or done):
                    farm.broker.check(call.pending, call.deadline, call.watch)
        except BrokerUnavailable:  # not waited for any more: let go without the broker
            release(call.pending, unsubscribe=False)
            raise
        except BaseException:
            release(call.pending)
            raise
        finally:
            farm.broker.quietly(lambda: farm.journal.drop_exec(exec_id))  # else it expires
        result = session.collect(call)
        if not seen_end:
            yield from self._rebuilt(result, seen_start, seq)
        self.result = session.settle(result, self.code, self.timeout_s, **self.kwargs)

    def _answer(self, event: HostCall, made: int) -> CallAnswer:
        callbacks = self.session.callbacks
        if callbacks is None:
            return CallAnswer(
                ok=False, error={"ename": "CallbackError", "evalue": "no callbacks registered"}
            )
        return callbacks.answer(event, made)

    def _rebuilt(self, result: ExecResult, seen_start: bool, seq: int) -> Iterator[Event]:
        """The events the worker could not publish, from the result (a Redis hiccup)."""
        exec_id, session_id, now = result.exec_id, self.session.id, time.time()
        if not seen_start:
            yield ExecStart(
                exec_id=exec_id,
                session_id=session_id,
                ts=now,
                seq=seq,
                code=self.code,
                epoch=self.session.epoch,
            )
            seq += 1
        yield from closing_events(
            result.model_dump(mode="json"),
            exec_id=exec_id,
            session_id=session_id,
            seq=seq,
            ts=now,
            ran=True,
        )
