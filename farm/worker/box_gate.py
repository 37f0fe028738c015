"""``BoxGate``: a worker's room for boxes, known before the kernel is asked and shared fairly.

Its size is the kernel's capacity (``Capacity.boxes``: boxes of the default limits, from every
budget the kernel adds up); a box of other limits weighs what it takes of those budgets
(``weight``). Invariants: what the gate admits together fits that capacity, so the kernel is
never asked for more than it holds (boxes still being emptied there are waited out by the
kernel's own admission); session opens go first, up to ``max_sessions`` held, so one huge map
cannot starve every agent session; map items share the rest one map after the other; judge
items are at most ``judge_parallel`` at once (tests are timed on cores of their own); a waiter
is admitted or gives up, never both. Design: docs/design/admission.md.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["open", "item", "judge"]
OPEN_WAITERS = 8  # opens that may wait at a worker at once (each holds one of its threads)
OPEN_WAIT_S = 10.0  # how long one waits there before its client asks again (maybe elsewhere)
KERNEL_WAIT_S = 10.0  # how long an admitted box may wait in the kernel (boxes still ending)
SERVED_KEPT = 4096  # maps whose last turn the gate remembers


def weight(limits: Mapping[str, int] | None, defaults: Mapping[str, int]) -> int:
    """How many boxes of the ``defaults`` a box of ``limits`` takes of the budgets that add
    up in a sandbox: its pids (and its pid 1), its disk."""
    wanted = {**defaults, **(limits or {})}
    pids = (wanted.get("pids", 0) + 1) / (defaults.get("pids", 0) + 1)
    disk = wanted.get("disk_mb", 0) / defaults["disk_mb"] if defaults.get("disk_mb") else 0
    return max(1, math.ceil(pids - 1e-9), math.ceil(disk - 1e-9))


@dataclass(eq=False)
class Ticket:
    """Room for one box (or a judge item's boxes, one after the other) until ``release``."""

    kind: Kind
    weight: int
    group: str  # a map's id, or "" for a session
    start: Callable[[Ticket], None] | None = None  # an item's: runs it once admitted
    state: Literal["waiting", "admitted", "released", "given up"] = "waiting"
    since: float = field(default_factory=time.monotonic)
    waited_s: float = 0.0
    # An open's: set once admitted (each waiting open wakes alone, never all of them at once)
    admitted_event: threading.Event = field(default_factory=threading.Event)

    @property
    def admitted(self) -> bool:
        return self.state == "admitted"


class BoxGate:
    def __init__(self, capacity: int, max_sessions: int, judge_parallel: int) -> None:
        self.capacity = capacity
        self.max_sessions = max_sessions
        self.judge_parallel = judge_parallel
        self.cond = threading.Condition()
        self.in_use = 0  # weights admitted and not released
        self.held = {"open": 0, "item": 0, "judge": 0}  # tickets admitted, by kind
        self._opens: deque[Ticket] = deque()
        self._maps: dict[str, deque[Ticket]] = {}  # a map's items waiting, in their order
        self._served: OrderedDict[str, int] = OrderedDict()  # map -> when it was last served
        self._ticks = 0

    # --- asking ----------------------------------------------------------------------------

    def open(self, box_weight: int, wait_s: float) -> Ticket | None:
        """Room for a session's box, waiting up to ``wait_s`` (ahead of every map item);
        ``None`` when there was none in time."""
        return self.admitted(self.queue_open(box_weight), wait_s)

    def queue_open(self, box_weight: int) -> Ticket:
        """Queue a session's box, ahead of every map item, without waiting (``admitted``)."""
        ticket = Ticket("open", box_weight, "")
        with self.cond:
            self._opens.append(ticket)
            started = self._dispatch()
        self._start(started)
        return ticket

    def admitted(self, ticket: Ticket, wait_s: float) -> Ticket | None:
        """``ticket`` (an open's) once admitted, waiting up to ``wait_s``; ``None`` when it
        was not in time (it gives up its place)."""
        if ticket.admitted_event.wait(max(wait_s, 0.0)):
            return ticket
        with self.cond:
            if ticket.admitted:  # admitted as its wait ended
                return ticket
            started = self._give_up(ticket)  # items it kept waiting may go now
        self._start(started)
        return None

    def submit(self, ticket: Ticket) -> None:
        """Queue a map item; ``ticket.start`` runs it (in this thread or a releasing one)
        once admitted, after the items queued before it from the same map."""
        with self.cond:
            self._maps.setdefault(ticket.group, deque()).append(ticket)
            started = self._dispatch()
        self._start(started)

    def cancel(self, ticket: Ticket) -> bool:
        """Take back a waiting ticket: ``True`` when it was never admitted (and never will)."""
        with self.cond:
            if ticket.state != "waiting":
                return False
            started = self._give_up(ticket)
        self._start(started)
        return True

    def release(self, ticket: Ticket) -> None:
        """The box (or boxes) of ``ticket`` ended: its room goes to who waits first."""
        with self.cond:
            if not ticket.admitted:
                return
            ticket.state = "released"
            self.in_use -= ticket.weight
            self.held[ticket.kind] -= 1
            started = self._dispatch()
        self._start(started)

    def resize(self, capacity: int) -> None:
        """The kernel's capacity changed (a sandbox replaced, boxes quarantined)."""
        with self.cond:
            if capacity == self.capacity:
                return
            self.capacity = capacity
            started = self._dispatch()
        self._start(started)

    # --- what it holds -------------------------------------------------------------------

    def waiting(self) -> dict[str, int]:
        """Opens and map items waiting for room now."""
        with self.cond:
            return {"open": len(self._opens), "item": sum(len(q) for q in self._maps.values())}

    def room(self) -> int:
        """Boxes of the default limits free now, beyond what waiters are owed."""
        with self.cond:
            return max(self.capacity - self.in_use - self._owed(), 0)

    def wait_for_room(self, timeout_s: float) -> tuple[bool, bool]:
        """Wait until a box is free with nothing queued for it, or ``timeout_s`` passes: may
        the intake take an open (sessions are not all held), may it take a chunk."""
        with self.cond:
            self.cond.wait_for(self._has_room, timeout_s)
            room = self._has_room()
            return room and self.held["open"] + len(self._opens) < self.max_sessions, room

    def _has_room(self) -> bool:
        return self.capacity - self.in_use - self._owed() > 0

    def _owed(self) -> int:
        """The room waiters will take: queued items, and opens unless sessions are full."""
        owed = sum(t.weight for q in self._maps.values() for t in q)
        if self.held["open"] < self.max_sessions:
            owed += sum(t.weight for t in self._opens)
        return owed

    # --- inside ---------------------------------------------------------------------------

    def _dispatch(self) -> list[Ticket]:
        """Admit what fits, in order (the caller holds the lock); the items admitted, to
        start outside it."""
        started: list[Ticket] = []
        self.cond.notify_all()  # room for the intake, maybe
        while self._opens and self.held["open"] < self.max_sessions:
            head = self._opens[0]
            if not self._fits(head):
                return started  # room that comes back goes to it first
            self._opens.popleft()
            self._admit(head)
        while self._maps:
            ready = [group for group, queue in self._maps.items() if not self._judge_full(queue[0])]
            if not ready:
                break
            turn = min(ready, key=lambda group: self._served.get(group, -1))  # longest unserved
            queue = self._maps[turn]
            if not self._fits(queue[0]):
                break
            ticket = queue.popleft()
            if not queue:
                del self._maps[turn]
            self._serve(turn)
            self._admit(ticket)
            started.append(ticket)
        return started

    def _serve(self, group: str) -> None:
        """Remember that ``group`` was served now (the few thousand maps served last)."""
        self._ticks += 1
        self._served[group] = self._ticks
        self._served.move_to_end(group)
        while len(self._served) > SERVED_KEPT:
            self._served.popitem(last=False)

    def _fits(self, ticket: Ticket) -> bool:
        return self.in_use + ticket.weight <= self.capacity

    def _judge_full(self, ticket: Ticket) -> bool:
        return ticket.kind == "judge" and self.held["judge"] >= self.judge_parallel

    def _admit(self, ticket: Ticket) -> None:
        ticket.state = "admitted"
        ticket.waited_s = time.monotonic() - ticket.since
        self.in_use += ticket.weight
        self.held[ticket.kind] += 1
        ticket.admitted_event.set()

    def _give_up(self, ticket: Ticket) -> list[Ticket]:
        """Take a waiting ticket out of its queue; the items that may go now it left."""
        ticket.state = "given up"
        if ticket.kind == "open":
            if ticket in self._opens:
                self._opens.remove(ticket)
        else:
            queue = self._maps.get(ticket.group)
            if queue is not None and ticket in queue:
                queue.remove(ticket)
                if not queue:
                    del self._maps[ticket.group]
        return self._dispatch()

    def _start(self, started: list[Ticket]) -> None:
        for ticket in started:
            assert ticket.start is not None
            ticket.start(ticket)
