"""``BatchRunner``: a worker's side of ``Farm.map`` and sweeps — chunks of items, each in a box.

Invariants: a chunk is claimed before its items start (a copy of its message runs nothing);
an item's ``exec_id`` is claimed before it runs (an item never runs twice); a cancelled map
starts no more items and its running ones are stopped. Each item's result is pushed as it
ends. Why and how: docs/design/map-engine.md.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from farm.backoff import delays
from farm.broker_errors import BROKER_DOWN
from farm.kernel.wire.client import KernelError, KernelRequestError
from farm.kernel.wire.protocol import INPUT_CODES, CellEvent
from farm.models import ErrorKind, ExecResult
from farm.models.batch import Chunk, ChunkItem, ItemDone
from farm.models.frames import ItemResults
from farm.registry import cancel_key
from farm.worker.egress import PolicyError
from farm.worker.judging import Judging
from farm.worker.recorder import ExecRecorder

if TYPE_CHECKING:
    from farm.worker.worker import Worker

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.5
LINGER_S = 0.005  # results of a chunk's items that end this close together share one push
FORGET_S = 60.0  # a map whose chunks this worker has not seen for this long is forgotten
RESULTS_TTL_S = 3600


class BatchRunner:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.pool = ThreadPoolExecutor(worker.settings.max_sessions, thread_name_prefix="batch")
        self.judging = Judging(worker.settings, worker.keeper, worker.id)
        self._open: dict[str, set[str]] = {}  # map id -> kernel sessions of its running items
        self._cancel_seen: dict[str, tuple[float, bool]] = {}  # map id -> (asked at, cancelled)
        self._lock = threading.Lock()

    def stop(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def run_chunk(self, payload: dict[str, Any]) -> dict[str, Any]:
        chunk = Chunk.model_validate(payload)
        registry = self.worker.registry
        if not registry.claim_chunk(chunk.chunk_id, self.worker.id, self.worker.generation):
            return {"chunk": chunk.chunk_id, "skipped": "claimed already (or abandoned)"}
        if self._cancelled(chunk.map_id):
            return {"chunk": chunk.chunk_id, "skipped": "the map was cancelled"}
        futures = {self.pool.submit(self._run, chunk, item): item for item in chunk.items}
        ran = 0
        while futures:
            done, _ = wait(futures, timeout=CANCEL_POLL_S, return_when=FIRST_COMPLETED)
            if done and len(done) < len(futures):  # its neighbours may be about to end too
                more, _ = wait(set(futures) - done, timeout=LINGER_S, return_when=ALL_COMPLETED)
                done |= more
            ended = [self._body(future, futures.pop(future)) for future in done]
            bodies = [body for body in ended if body is not None]
            if bodies:
                self._publish(chunk.results, bodies, expire=not ran)
                ran += len(bodies)
            if futures and self._cancelled(chunk.map_id):
                self._cancel(chunk.map_id, futures)
                break
        return {"chunk": chunk.chunk_id, "ran": ran}

    def _body(self, future: Future[str | None], item: ChunkItem) -> str | None:
        """What to publish of an item that ended: its result, none for a copy that ran
        nothing, an ``infra`` failure for one that broke the worker's own code (the client
        retries those: leaving its claim unanswered would keep the map waiting on it)."""
        try:
            return future.result()
        except Exception as exc:
            log.exception("item %s of worker %s failed", item.exec_id, self.worker.id)
            done = ItemDone(key=item.key, exec_id=item.exec_id, worker=self.worker.id)
            why = f"worker {self.worker.id} failed to run the item: {exc!r}"
            done.cells.append(self._failure(item, ErrorKind.INFRA, type(exc).__name__, why))
            return done.model_dump_json()

    def _publish(self, results: str, bodies: list[str], expire: bool) -> None:
        """One push for the results of items that ended together (one wake-up of the client
        too); the list gets its TTL with the chunk's first push. A broker outage is waited out
        as long as clients wait one out: a result lost here would leave its item claimed by a
        live worker, and its map waiting for it."""
        deadline = time.monotonic() + self.worker.settings.broker_wait_s
        for delay in delays(0.1, 2.0):
            try:
                with self.worker.registry.redis.pipeline(transaction=False) as pipe:
                    pipe.rpush(results, *bodies)
                    if expire:
                        pipe.expire(results, RESULTS_TTL_S)
                    pipe.execute()
                return
            except BROKER_DOWN:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)  # the backoff's pause (farm.backoff), within the deadline

    def _cancelled(self, map_id: str) -> bool:
        """Whether the client cancelled the map: asked of Redis at most every
        ``CANCEL_POLL_S`` for all this worker's chunks of it (once per item that ended was a
        command an item and a fifth of the worker's Python time), and remembered once true."""
        now = time.monotonic()
        with self._lock:
            seen = self._cancel_seen.get(map_id)
            if seen is not None and (seen[1] or now - seen[0] < CANCEL_POLL_S):
                return seen[1]
        try:
            cancelled = bool(self.worker.registry.redis.exists(cancel_key(map_id)))
        except BROKER_DOWN:
            return False  # an outage is no cancel: the items go on, their results wait for it
        with self._lock:
            for old in [m for m, (at, _) in self._cancel_seen.items() if now - at > FORGET_S]:
                del self._cancel_seen[old]
            self._cancel_seen[map_id] = (now, cancelled)
        return cancelled

    def _cancel(self, map_id: str, futures: dict[Future[str | None], ChunkItem]) -> None:
        for future in futures:
            future.cancel()
        with self._lock:
            running = self._open.pop(map_id, set())
        for session_id in running:  # its box is reset: every process it started dies
            try:
                with self.worker.kernel() as kernel:
                    kernel.close_session(session_id)
            except KernelError:  # the item ended meanwhile (no such session), or the
                pass  # connection broke (the lent client was dropped: the next gets a new one)
        log.info(
            "map %s cancelled on worker %s: %d items stopped", map_id, self.worker.id, len(running)
        )

    def _run(self, chunk: Chunk, item: ChunkItem) -> str | None:
        """Run one item if this worker is the first to claim it: what it did, to publish."""
        worker = self.worker
        claim = worker.registry.claim_exec(
            item.exec_id, worker.id, worker.generation, item.timeout_s
        )
        if claim is not None:  # ran (or runs) elsewhere: this copy runs nothing
            return None
        if item.judge is not None:  # a submission to judge: cache and special judge around it
            return self.judging.run(chunk, item, self._cells).model_dump_json()
        return self._cells(chunk, item).model_dump_json()

    def _cells(self, chunk: Chunk, item: ChunkItem) -> ItemDone:
        """Run the item in a box of its own, in one round trip to the kernel (its ``item``
        request: open, files, cells, command, close); its session id is chosen here, so that
        a cancelled map can close the box while it runs."""
        worker = self.worker
        session_id = uuid.uuid4().hex
        done = ItemDone(key=item.key, exec_id=item.exec_id, worker=worker.id, session_id=session_id)
        recorders = {
            f"{item.exec_id}-{n}": ExecRecorder(
                worker.journal,
                {"exec_id": f"{item.exec_id}-{n}", "session_id": session_id, "code": code},
                worker.id,
            )
            for n, code in enumerate(item.cells)
            if chunk.journal  # the item's journal, for sweeps that keep it
        }

        def on_event(exec_id: str, event: CellEvent) -> None:
            recorder = recorders.get(exec_id)
            if recorder is None:
                return
            if event["type"] == "done":  # the cell ended: its record closes now, in order
                del recorders[exec_id]
                recorder.finish({**event["result"], "worker": worker.id})
            else:
                recorder.on_kernel_event(event)

        try:
            policy = worker.egress.policy(item.egress)
        except PolicyError as exc:
            done.cells.append(self._failure(item, ErrorKind.INPUT, "InvalidRequest", str(exc)))
            return done
        with self._lock:
            self._open.setdefault(chunk.map_id, set()).add(session_id)
        try:
            if policy is not None:
                worker.egress.expect(session_id, policy, journal=chunk.journal)
            with worker.kernel() as kernel:
                reply = kernel.item(
                    item.exec_id,
                    item.cells,
                    timeout_s=item.timeout_s,
                    session_id=session_id,
                    limits=item.limits,
                    files={path: text.encode() for path, text in item.files.items()},
                    argv=item.argv,
                    judge=item.judge,
                    grace_s=worker.settings.limits.grace_s,
                    on_event=on_event if recorders else None,  # cell events, each cell's end
                    egress=policy is not None,
                )
            outcome = ItemResults.from_kernel(reply, worker.id, item.timeout_s)
        except KernelRequestError as exc:
            kind = ErrorKind.INPUT if exc.code in INPUT_CODES else ErrorKind.INFRA
            done.cells.append(self._failure(item, kind, "BadRequest", str(exc)))
            return done
        except KernelError as exc:
            why = f"the sandbox of worker {worker.id} failed during the item: {exc}"
            done.cells.append(self._failure(item, ErrorKind.SANDBOX_LOST, "SessionLost", why))
            return done
        finally:
            self._forget(chunk.map_id, session_id)
            done.egress = worker.egress.forget(session_id)
        for result in outcome.cells:  # cells whose end the kernel could not tell (none, usually)
            recorder = recorders.get(result.exec_id)
            if recorder is not None:
                recorder.finish(result.model_dump(mode="json"))
        done.cells = outcome.cells
        done.judge = outcome.judge
        if outcome.file_error is not None:
            error = outcome.file_error
            why = f"writing {error['path']!r}: {error['ename']}: {error['evalue']}"
            done.cells.append(self._failure(item, ErrorKind.INPUT, "FileOperationError", why))
        done.command = outcome.command
        return done

    def _forget(self, map_id: str, session_id: str) -> None:
        """The item ended (its box is closed by the kernel): nothing to cancel any more."""
        with self._lock:
            running = self._open.get(map_id, set())
            running.discard(session_id)
            if not running:
                self._open.pop(map_id, None)

    def _failure(self, item: ChunkItem, kind: ErrorKind, ename: str, evalue: str) -> ExecResult:
        return ExecResult.failure(
            kind,
            ename,
            evalue,
            exec_id=item.exec_id,
            worker=self.worker.id,
            state_lost=kind == ErrorKind.SANDBOX_LOST,
        )
