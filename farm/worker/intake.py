"""``Intake``: a worker takes session opens and map chunks from Redis only while it has room.

Opens and chunks wait in Redis, one list of each per image (``registry.opens_key``,
``chunks_key``), not on a worker: one thread per worker takes the oldest open, else the oldest
chunk, whenever a box is free with no work queued for it (``BoxGate.wait_for_room``; an open
only while its sessions are not all held). So a worker holds at most its capacity running and
what it took last; the rest stays in the lists for any worker with room, and the lists'
lengths are the backlog an autoscaler reads. Design: docs/design/admission.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from farm.broker_errors import BROKER_DOWN
from farm.registry import Registry
from farm.worker.box_gate import BoxGate

log = logging.getLogger(__name__)

POP_BLOCK_S = 1.0  # one BRPOP a second while the list is empty (kombu's own poll rate)
ROOM_POLL_S = 1.0  # how often a full worker looks again (room usually wakes it at once)
OUTAGE_PAUSE_S = 1.0
NOT_READY_POLL_S = 0.1


class Intake:
    """Takes opens from list ``opens`` and chunks from list ``chunks`` for a worker
    (``name``) while ``gate`` has room and its sandbox is ``ready``; each goes to its taker
    (``Worker.take_open``, ``BatchRunner.take``), which queues it at the gate at once."""

    def __init__(
        self,
        name: str,
        lists: tuple[str, str],
        registry: Registry,
        gate: BoxGate,
        ready: Callable[[], bool],
        takers: tuple[Callable[[str], None], Callable[[str], None]],
    ) -> None:
        self.name = name
        self.opens, self.chunks = lists
        self.registry = registry
        self.gate = gate
        self.ready = ready
        self.takers = dict(zip(lists, takers, strict=True))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take work from now on (with the worker's Celery consumer: ``farm.worker.tasks``)."""
        if self._thread is not None:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(self._stop,), name="farm-intake", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Take no more work; what was taken meanwhile still starts (a pop ends within
        ``POP_BLOCK_S``)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(POP_BLOCK_S + 5.0)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.ready():  # its sandbox is being replaced: poll until it is up
                stop.wait(NOT_READY_POLL_S)
                continue
            open_room, chunk_room = self.gate.wait_for_room(ROOM_POLL_S)
            lists = [
                name for name, room in ((self.opens, open_room), (self.chunks, chunk_room)) if room
            ]
            if not lists:
                continue
            try:
                found = self.registry.pop_work(lists, POP_BLOCK_S)
            except BROKER_DOWN as exc:
                log.warning("worker %s cannot take work: %s", self.name, exc)
                stop.wait(OUTAGE_PAUSE_S)  # the broker's outage, not a readiness wait
                continue
            if found is None:
                continue
            key, body = found
            try:
                self.takers[key](body)
            except Exception:  # work that breaks the worker's own code: say it, go on
                log.exception("worker %s could not take work from %s", self.name, key)
