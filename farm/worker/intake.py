"""``Intake``: a worker takes map chunks from its image's list only while it has room.

Chunks wait in Redis (``registry.chunks_key``), not on a worker: one thread per worker takes
the oldest whenever a box is free with no item queued for it (``BoxGate.wait_for_room``), so a
worker holds at most its capacity of items running plus the chunk it took last, the others stay
in the list for any worker with room, and the list's length is the backlog an autoscaler reads.
A chunk is claimed as soon as it is taken (``BatchRunner.take``). Design: docs/design/admission.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from farm.broker_errors import BROKER_DOWN
from farm.registry import Registry
from farm.worker.admission import BoxGate

log = logging.getLogger(__name__)

POP_BLOCK_S = 1.0  # one BRPOP a second while the list is empty (kombu's own poll rate)
ROOM_POLL_S = 1.0  # how often a full worker looks again (room usually wakes it at once)
OUTAGE_PAUSE_S = 1.0
NOT_READY_POLL_S = 0.1


class Intake:
    """Takes chunks from list ``key`` for a worker (``name``) while ``gate`` has room and
    its sandbox is ``ready``; each goes to ``take`` (``BatchRunner.take``)."""

    def __init__(
        self,
        name: str,
        key: str,
        registry: Registry,
        gate: BoxGate,
        ready: Callable[[], bool],
        take: Callable[[str], None],
    ) -> None:
        self.name = name
        self.key = key
        self.registry = registry
        self.gate = gate
        self.ready = ready
        self.take = take
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take chunks from now on (with the worker's Celery consumer: ``farm.worker.tasks``)."""
        if self._thread is not None:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(self._stop,), name="farm-intake", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Take no more chunks; one taken meanwhile still starts (a pop ends within
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
            if not self.gate.wait_for_room(ROOM_POLL_S):
                continue
            try:
                body = self.registry.pop_chunk(self.key, POP_BLOCK_S)
            except BROKER_DOWN as exc:
                log.warning("worker %s cannot take chunks: %s", self.name, exc)
                stop.wait(OUTAGE_PAUSE_S)  # the broker's outage, not a readiness wait
                continue
            if body is None:
                continue
            try:
                self.take(body)
            except Exception:  # a chunk that breaks the worker's own code: say it, go on
                log.exception("worker %s could not take a chunk", self.name)
