"""``RunLane``: a worker generation takes its sessions' plain runs from its run lane.

One thread pops the lane (``farm.events.lanes``, oldest first) while a pool thread is free, so
what the worker cannot start stays in Redis; each run is the call Celery's ``farm.exec`` task
makes (``guarded`` around ``SessionCalls.execute``), whose end-of-call script pushes the
result on its reply list (``LaneReply``); a call refused or lost before it ran is answered
here. The lane stops before the worker does (``Worker.stop``): the runs it took end first;
those left in the list are its clients' to see gone with the worker, as a stopped Celery
consumer's queue.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from farm.broker_errors import BROKER_DOWN
from farm.events.exec_finish import Reply
from farm.events.lanes import FAILED, REPLY_TTL_S, lane_key, push_reply, reply_key
from farm.registry import Registry

log = logging.getLogger(__name__)

POP_BLOCK_S = 1.0  # one blocking pop a second while the lane is empty (as the intake's)
OUTAGE_PAUSE_S = 1.0


class LaneReply:
    """Where one run's result goes: its reply list, pushed by the end-of-call script."""

    def __init__(self, exec_id: str) -> None:
        self.exec_id = exec_id
        self.done = False

    def encode(self, result: str) -> Reply:
        return Reply(reply_key(self.exec_id), result, REPLY_TTL_S, pushed=True)

    def stored(self) -> None:
        self.done = True


Run = Callable[[object, LaneReply], dict[str, Any]]


class RunLane:
    """Pops runs from lane ``queue`` of ``registry`` for ``run``, ``threads`` at once."""

    def __init__(self, name: str, registry: Registry, run: Run, threads: int) -> None:
        self.name = name
        self.registry = registry
        self.run = run
        self.threads = threads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def start(self, queue: str) -> None:
        """Take runs from ``queue``'s lane from now on."""
        if self._thread is not None:
            return
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="farm-lane")
        free = threading.Semaphore(self.threads)
        self._thread = threading.Thread(
            target=self._loop,
            args=(lane_key(queue), free, self._pool, self._stop),
            name="farm-lane",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Take no more runs; those taken end first (a pop ends within ``POP_BLOCK_S``)."""
        self._stop.set()
        thread, pool, self._thread, self._pool = self._thread, self._pool, None, None
        if thread is not None:
            thread.join(POP_BLOCK_S + 5.0)
        if pool is not None:
            pool.shutdown(wait=True)

    def _loop(
        self,
        key: str,
        free: threading.Semaphore,
        pool: ThreadPoolExecutor,
        stop: threading.Event,
    ) -> None:
        while not stop.is_set():
            if not free.acquire(timeout=POP_BLOCK_S):
                continue
            try:
                popped = self.registry.wait_answer(key, POP_BLOCK_S)
            except BROKER_DOWN as exc:
                free.release()
                log.warning("worker %s cannot take runs: %s", self.name, exc)
                stop.wait(OUTAGE_PAUSE_S)  # the broker's outage, not a readiness wait
                continue
            if popped is None:
                free.release()
                continue
            pool.submit(self._one, popped, free)

    def _one(self, body: str, free: threading.Semaphore) -> None:
        try:
            try:
                request: object = json.loads(body)
            except ValueError:
                request = body
            exec_id = request.get("exec_id") if isinstance(request, dict) else None
            if not isinstance(exec_id, str) or not exec_id:
                log.warning("worker %s dropped a run with no exec id: %.200s", self.name, body)
                return
            reply = LaneReply(exec_id)
            try:
                result = self.run(request, reply)
            except Exception as exc:  # the worker's own code failed it: its caller is told
                log.exception("worker %s failed run %s", self.name, exec_id)
                result = {FAILED: f"{type(exc).__name__}: {exc}"}
            if not reply.done:
                try:
                    push_reply(self.registry, exec_id, json.dumps(result))
                except BROKER_DOWN as exc:  # its client sees the outage too, and the mark
                    log.warning("worker %s could not answer run %s: %s", self.name, exec_id, exc)
        finally:
            free.release()
