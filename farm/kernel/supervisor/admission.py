"""``Admission``: a box that does not fit now waits for a box to end, first come first served.

Only the kernel knows when a box's budgets are free again (its number goes back once nothing of
the box is left, in the background after its session closed), so a request that finds no room
waits here and is admitted the moment it fits. Invariants: waiters are admitted in arrival order
(a big box is never passed by small ones for ever); a spare never keeps room a waiter needs; past
its ``wait_s`` a request is refused with ``too_many_sessions`` and nothing of it ran, so the host
may send it again. A box that could never fit is refused at once (``Caps.check``: bad_limits).
Design: docs/design/admission.md.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..boxes.pool import Box, BoxPool
from ..wire.protocol import MAX_WAIT_S, BoxLimits, Capacity
from .links import RequestError

T = TypeVar("T")


@dataclass
class _Waiter:
    limits: BoxLimits
    future: asyncio.Future[Box]


class Admission:
    """Boxes for sessions and items: given at once when they fit, else in arrival order."""

    def __init__(self, pool: BoxPool, max_sessions: int, defaults: BoxLimits) -> None:
        self.pool = pool
        self.max_sessions = max_sessions
        self.defaults = defaults  # a box's limits when the host names none
        self.admitted = 0  # boxes of sessions and items, from their admission to their close
        self.waiters: deque[_Waiter] = deque()
        self.refused = 0  # requests that waited past their wait_s, so far
        # Called while a waiter does not fit: the spawner ends a spare, whose room it holds.
        self.on_starved: Callable[[], None] = lambda: None

    async def box(
        self, limits: BoxLimits, wait_s: float, gone: asyncio.Future[Any] | None = None
    ) -> Box:
        """A box of ``limits`` for a session or an item, once it fits; ``too_many_sessions``
        when it did not within ``wait_s``, ``unavailable`` when ``gone`` (the read of the
        host's next frame) ends with the connection meanwhile: no box for a host that left."""
        if not self.waiters:
            box = self._take(limits)
            if box is not None:
                return box
        if wait_s <= 0:
            self.refused += 1
            raise RequestError("too_many_sessions", self.why(limits))
        waiter = _Waiter(limits, asyncio.get_running_loop().create_future())
        self.waiters.append(waiter)
        self.wake()  # it may fit after all, or starve a spare
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(wait_s, MAX_WAIT_S)
        watched: set[asyncio.Future[Any]] = {waiter.future}
        try:
            while not waiter.future.done():
                left = deadline - loop.time()
                if left <= 0 or host_left(gone):
                    break
                if gone is not None and not gone.done():  # else a frame came: wait on
                    watched.add(gone)
                await asyncio.wait(watched, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                watched = {waiter.future}
        except asyncio.CancelledError:  # the kernel stops: a box given meanwhile goes back
            self._give_up(waiter)
            raise
        if waiter.future.done() and not host_left(gone):
            return waiter.future.result()
        self._give_up(waiter)
        if host_left(gone):
            raise RequestError("unavailable", "the host's connection ended while the box waited")
        self.refused += 1
        why = self.why(limits)
        raise RequestError("too_many_sessions", f"no room within {wait_s:g} s: {why}")

    def _give_up(self, waiter: _Waiter) -> None:
        """Stop waiting: ``wake`` skips it from now on; a box it was given goes back."""
        if waiter.future.done() and not waiter.future.cancelled():
            self.release(waiter.future.result(), returned=True)
        waiter.future.cancel()

    def spare(self, take: Callable[[], T | None]) -> T | None:
        """A spare process (``take``: its box is held already) for a session, counted as
        admitted, if the kernel may hold one more session now."""
        if self.admitted >= self.max_sessions:
            return None
        taken = take()
        if taken is not None:
            self.admitted += 1
        return taken

    async def spare_later(self, coming: Callable[[], Awaitable[T | None]]) -> T | None:
        """A spare on its way (``coming``: its box is held already) for a session, counted as
        admitted from now (a place kept while it waits), if the kernel may hold one more."""
        if self.admitted >= self.max_sessions:
            return None
        self.admitted += 1
        taken = None
        try:
            taken = await coming()
        finally:
            if taken is None:  # it failed (or the wait was cancelled): the place goes back
                self.release()
        return taken

    def release(self, box: Box | None = None, *, returned: bool = False) -> None:
        """A session or item ended (its box ends in the background, and its budgets come back
        with ``wake``); ``returned``: ``box`` was admitted but never used, its number is free."""
        self.admitted -= 1
        if box is not None and returned:
            self.pool.give_back(box, clean=True)
        self.wake()

    def wake(self) -> None:
        """Admit the waiters that fit now, in order (called whenever room may have come)."""
        while self.waiters:
            head = self.waiters[0]
            if head.future.done():  # gave up waiting
                self.waiters.popleft()
                continue
            box = self._take(head.limits)
            if box is None:
                if self.admitted < self.max_sessions:
                    self.on_starved()  # room is what it lacks: a spare holds some
                return
            self.waiters.popleft()
            head.future.set_result(box)

    def _take(self, limits: BoxLimits) -> Box | None:
        if self.admitted >= self.max_sessions:
            return None
        box = self.pool.take(limits)
        if box is not None:
            self.admitted += 1
        return box

    def why(self, limits: BoxLimits) -> str:
        """Why a box of ``limits`` does not fit now."""
        if self.admitted >= self.max_sessions:
            return f"this kernel holds {self.max_sessions} sessions"
        return self.pool.room(limits) or "every box number of this kernel is in use"

    def capacity(self, spares: int, making: int) -> Capacity:
        """How many boxes of the default limits this kernel holds in all and has free now
        (its ready ``spares`` included: a session takes one at once), and why not more;
        ``making``: spares on their way."""
        boxes, binding = self.pool.capacity(self.defaults)
        if self.max_sessions < boxes:
            boxes, binding = self.max_sessions, "sessions"
        free = min(self.pool.fits(self.defaults) + spares, self.max_sessions - self.admitted)
        return {
            "boxes": boxes,
            "free": max(free, 0),
            "binding": binding,
            "admitted": self.admitted,
            "waiting": sum(not w.future.done() for w in self.waiters),
            "ending": len(self.pool.held) - self.admitted - spares - making,
            "refused": self.refused,
        }


def host_left(gone: asyncio.Future[Any] | None) -> bool:
    """Whether ``gone``, the read of the host's next frame, found the connection's end."""
    if gone is None or not gone.done():
        return False
    return gone.cancelled() or gone.exception() is not None or gone.result() is None
