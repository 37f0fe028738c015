"""One ``farm serve``'s share of the ``/judge0`` work: it takes queued submissions (at most
``judge0_parallel`` at once), judges each element (one submission, or a batch) in one map,
records each result as it ends and calls back its ``callback_url``; it beats a heartbeat and
queues again what dead servers had claimed (``farm.serve.judge0_store``).

Callbacks are Judge0's: a ``PUT`` of the submission (base64, the default fields) as JSON, at
most ``CALLBACK_TRIES`` tries ``CALLBACK_TIMEOUT_S`` each, with a doubling pause between
them, on threads of their own (a slow receiver never holds up judging). A connection error,
a 5xx, 408 or 429 is tried again; any other answer ends it. Why: docs/design/judge.md.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx

from farm.judge import JUDGE_IMAGE
from farm.models.batch import BatchRecord
from farm.serve.judge0_input import item
from farm.serve.judge0_store import ALIVE_S, MAX_ATTEMPTS, Judge0Store, Started
from farm.serve.judge0_view import view
from farm.serve.problem_documents import ProblemError

if TYPE_CHECKING:
    from farm.client import Farm

log = logging.getLogger(__name__)
HEARTBEAT_S = ALIVE_S / 5
CLAIM_WAIT_S = 1.0  # a blocked claim gives up this often to see whether the server stops
CALLBACK_TRIES = 3  # Judge0's callbacks_max_tries
CALLBACK_TIMEOUT_S = 5.0  # Judge0's callbacks_timeout
CALLBACK_PAUSE_S = 1.0  # before the second try; doubled before each next
RETRIED = {408, 429}


class Runner:
    """The server's judging of queued submissions, from ``start`` to ``stop``."""

    def __init__(self, farm: Farm, store: Judge0Store, parallel: int) -> None:
        self.farm, self.store = farm, store
        self.replica = uuid.uuid4().hex
        self.stopping = threading.Event()
        self.slots = threading.Semaphore(parallel)
        self.judges = ThreadPoolExecutor(parallel, thread_name_prefix="judge0")
        self.callbacks = ThreadPoolExecutor(4, thread_name_prefix="judge0-callback")
        self.threads = [
            threading.Thread(target=self._beat, name="judge0-heartbeat", daemon=True),
            threading.Thread(target=self._take, name="judge0-queue", daemon=True),
        ]

    def start(self) -> None:
        self.store.heartbeat(self.replica)
        self.store.requeue_dead(self.replica)
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        """Take no more; what this server still judges goes back to the queue at once."""
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=CLAIM_WAIT_S * 5)
        self.judges.shutdown(wait=False, cancel_futures=True)
        self.callbacks.shutdown(wait=False, cancel_futures=True)
        try:
            self.store.retire(self.replica)
        except Exception as exc:  # the broker is gone: the others queue them after ALIVE_S
            log.warning("judge0: could not hand back this server's claims: %s", exc)

    def judge_now(self, element: str) -> None:
        """Judge ``element``, stored as this server's claim (``wait=true``), on this thread:
        should the server die meanwhile, another queues it again."""
        try:
            self.judge(element)
        finally:
            self.store.release(self.replica, element)

    def judge(self, element: str) -> None:
        """Judge one queued element in one map, each result recorded as it ends; a map that
        fails ends its unfinished submissions as Internal Error, never leaves them queued."""
        items: list[dict[str, Any]] = []
        left: dict[str, Started] = {}
        for token in element.split(","):
            started = self.store.start(token)
            if started is None:
                continue  # deleted or expired meanwhile
            if started.attempts > MAX_ATTEMPTS:
                why = (
                    f"its judging was cut off {MAX_ATTEMPTS} times (a farm serve stopped "
                    "while judging it): not tried again"
                )
                self._finish(started, _failed(token, why))
                continue
            try:
                items.append(item(started.doc, started.files))
            except ProblemError as exc:  # checked when it was made: only a changed table
                self._finish(started, _failed(token, exc.detail, "input"))
                continue
            left[token] = started
        if not items:
            return
        try:
            for record in self.farm.map(items, image=JUDGE_IMAGE, ordered=False, retries=1):
                started = left.pop(str(record.id), None)
                if started is not None:
                    self._finish(started, record)
        except Exception as exc:
            log.warning("judge0: a map of %d submissions failed: %s", len(items), exc)
            if self.stopping.is_set():
                return  # the farm closes with the server: they were handed back to the queue
            for key, started in left.items():
                self._finish(started, _failed(key, f"{type(exc).__name__}: {exc}"))

    def _finish(self, started: Started, record: BatchRecord) -> None:
        if self.stopping.is_set() and not record.ok:
            return  # cut off by this server's end, and queued again: not the verdict
        if not self.store.finish(started.token, record):
            return
        url = started.doc.get("callback_url")
        if url:
            entry = self.store.load(started.token)
            if entry is not None:
                self.callbacks.submit(self._call_back, url, view(entry, None, True))

    def _call_back(self, url: str, body: dict[str, Any]) -> None:
        pause = CALLBACK_PAUSE_S
        for attempt in range(1, CALLBACK_TRIES + 1):
            try:
                answer = httpx.put(url, json=body, timeout=CALLBACK_TIMEOUT_S)
                if answer.status_code < 500 and answer.status_code not in RETRIED:
                    return
                why = f"HTTP {answer.status_code}"
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            if attempt == CALLBACK_TRIES or self.stopping.wait(pause):  # backoff, or stop
                log.warning("judge0: callback of %s failed: %s (%d tries)", url, why, attempt)
                return
            pause *= 2

    def _take(self) -> None:
        """Claim queued elements while a slot is free, each judged on a thread of its own."""
        while not self.stopping.is_set():
            if not self.slots.acquire(timeout=CLAIM_WAIT_S):
                continue
            try:
                element = self.store.claim(self.replica, CLAIM_WAIT_S)
            except Exception as exc:  # the broker away a moment: the heartbeat's loop says so
                log.debug("judge0: claim failed: %s", exc)
                element = None
                self.stopping.wait(CLAIM_WAIT_S)
            if element is None:
                self.slots.release()
                continue
            try:
                self.judges.submit(self._judge_claimed, element)
            except RuntimeError:  # shut down: it goes back to the queue with the rest
                self.slots.release()

    def _judge_claimed(self, element: str) -> None:
        try:
            self.judge(element)
        except Exception as exc:
            log.warning("judge0: judging %s failed: %s", element, exc)
        finally:
            self.slots.release()
            try:
                self.store.release(self.replica, element)
            except Exception as exc:
                log.warning("judge0: could not release %s: %s", element, exc)

    def _beat(self) -> None:
        while not self.stopping.wait(HEARTBEAT_S):
            try:
                self.store.heartbeat(self.replica)
                moved = self.store.requeue_dead(self.replica)
                if moved:
                    log.warning("judge0: queued again %d elements of stopped servers", moved)
            except Exception as exc:
                log.warning("judge0: heartbeat failed: %s", exc)


def _failed(token: str, why: str, kind: str = "infra") -> BatchRecord:
    return BatchRecord(id=token, status="error", kind=kind, message=why)
