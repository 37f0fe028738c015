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
from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from farm.backoff import delays
from farm.broker_errors import BROKER_DOWN
from farm.kernel.wire.client import KernelError, KernelRequestError
from farm.kernel.wire.protocol import INPUT_CODES, CellEvent
from farm.models import ErrorKind, ExecRequest, ExecResult
from farm.models.batch import Chunk, ChunkItem, ItemDone
from farm.models.frames import ItemResults
from farm.registry import ITEM_CLAIM_S, cancel_key
from farm.worker.box_gate import KERNEL_WAIT_S, Ticket, weight
from farm.worker.judge_items import Judging
from farm.worker.recorder import ExecRecorder
from farm.worker.worker_egress import PolicyError
from farm.worker.worker_host import WorkerHost

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.5
ITEM_THREADS = 512  # started as needed; the gate admits no more items than boxes fit
ROOMLESS_CODES = frozenset({"too_many_sessions"})  # refusals that waiting could have cured
LINGER_S = 0.005  # results of a chunk's items that end this close together share one push
FORGET_S = 60.0  # a map whose chunks this worker has not seen for this long is forgotten
RESULTS_TTL_S = 3600


class BatchRunner:
    def __init__(self, worker: WorkerHost) -> None:
        self.worker = worker
        self.gate = worker.gate
        # An item runs on a thread of its own once the gate admits it: the gate bounds them.
        self.items = ThreadPoolExecutor(ITEM_THREADS, thread_name_prefix="batch")
        # A chunk's driver waits for its items and pushes their results as they end.
        self.drivers = ThreadPoolExecutor(ITEM_THREADS, thread_name_prefix="chunk")
        self.judging = Judging(worker.settings, worker.keeper, worker.id, worker.registry.redis)
        self._open: dict[str, set[str]] = {}  # map id -> kernel sessions of its running items
        self._cancel_seen: dict[str, tuple[float, bool]] = {}  # map id -> (asked at, cancelled)
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def stop(self) -> None:
        """Start nothing more; drivers stop waiting (the client sends what never ran again)."""
        self._stopped.set()
        self.drivers.shutdown(wait=False, cancel_futures=True)
        self.items.shutdown(wait=False, cancel_futures=True)

    def take(self, body: str) -> None:
        """A chunk the intake took: claimed (a copy of its message runs nothing), its items
        queued at the gate in their order, and a driver that publishes each result as it
        ends. Nothing here waits for room: the intake took the chunk because there was some."""
        popped = time.time()
        chunk = Chunk.model_validate_json(body)
        registry = self.worker.registry
        if not registry.claim_chunk(chunk.chunk_id, self.worker.id, self.worker.generation):
            return
        if self._cancelled(chunk.map_id):
            return
        queued_s = max(popped - chunk.sent_at, 0.0) if chunk.sent_at else 0.0
        pending: dict[Future[str | None], tuple[ChunkItem, Ticket]] = {}
        for item in chunk.items:
            future: Future[str | None] = Future()
            ticket = Ticket(
                "judge" if item.submission is not None else "item",
                weight(item.limits, self.worker.box_defaults()),
                chunk.map_id,
                start=self._starter(chunk, item, future, queued_s),
            )
            pending[future] = (item, ticket)
        tickets = [ticket for _, ticket in pending.values()]  # the driver empties ``pending``
        self.drivers.submit(self._drive, chunk, pending)
        for ticket in tickets:  # after the driver exists: an item may end at once
            self.gate.submit(ticket)

    def _starter(
        self, chunk: Chunk, item: ChunkItem, future: Future[str | None], queued_s: float
    ) -> Callable[[Ticket], None]:
        """What the gate calls once it admits ``item``: run it on a thread of its own, its
        result in ``future``, and give its room back when it ends."""

        def run(ticket: Ticket) -> None:
            if self._cancelled(chunk.map_id):  # admitted as its map was cancelled: not run
                future.cancel()
            if not future.set_running_or_notify_cancel():
                self.gate.release(ticket)
                return
            try:
                future.set_result(self._run(chunk, item, queued_s + ticket.waited_s))
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                self.gate.release(ticket)

        def start(ticket: Ticket) -> None:
            try:
                self.items.submit(run, ticket)
            except RuntimeError:  # the worker stops: it never ran, its client sends it again
                future.cancel()
                self.gate.release(ticket)

        return start

    def _drive(
        self, chunk: Chunk, pending: dict[Future[str | None], tuple[ChunkItem, Ticket]]
    ) -> None:
        """Publish each item's result as it ends (those that end together in one push), and
        stop the chunk's items when its map is cancelled."""
        ran = 0
        while pending and not self._stopped.is_set():
            done, _ = wait(pending, timeout=CANCEL_POLL_S, return_when=FIRST_COMPLETED)
            if done and len(done) < len(pending):  # its neighbours may be about to end too
                more, _ = wait(set(pending) - done, timeout=LINGER_S, return_when=ALL_COMPLETED)
                done |= more
            ended = [self._body(future, pending.pop(future)[0]) for future in done]
            bodies = [body for body in ended if body is not None]
            if bodies:
                self._publish(chunk.results, bodies, expire=not ran)
                ran += len(bodies)
            if pending and self._cancelled(chunk.map_id):
                self._cancel(chunk.map_id, pending)
                break

    def _body(self, future: Future[str | None], item: ChunkItem) -> str | None:
        """What to publish of an item that ended: its result, none for a copy that ran
        nothing (or one cancelled before it started), an ``infra`` failure for one that broke
        the worker's own code (the client retries those: leaving its claim unanswered would
        keep the map waiting on it)."""
        if future.cancelled():
            return None
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

    def _cancel(
        self, map_id: str, pending: dict[Future[str | None], tuple[ChunkItem, Ticket]]
    ) -> None:
        for future, (_, ticket) in pending.items():
            if self.gate.cancel(ticket):  # still waiting for room: it never starts
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

    def _run(self, chunk: Chunk, item: ChunkItem, queued_s: float) -> str | None:
        """Run one item if this worker is the first to claim it: what it did, to publish;
        ``queued_s``: how long it waited for room so far (in the list, at the gate)."""
        worker = self.worker
        claim = worker.registry.claim_exec(
            item.exec_id, worker.id, worker.generation, item.timeout_s, keep_s=ITEM_CLAIM_S
        )
        if claim is not None:  # ran (or runs) elsewhere: this copy runs nothing
            return None
        if item.submission is not None:  # to judge: its problem, cache, special judge, score
            done = self.judging.run(chunk, item, self._cells)
        else:
            done = self._cells(chunk, item)
        done.queue_s += queued_s
        return done.model_dump_json()

    def _cells(self, chunk: Chunk, item: ChunkItem) -> ItemDone:
        """Run the item in a box of its own, in one round trip to the kernel (its ``item``
        request: open, files, cells, command, close); its session id is chosen here, so that
        a cancelled map can close the box while it runs."""
        worker = self.worker
        session_id = uuid.uuid4().hex
        done = ItemDone(key=item.key, exec_id=item.exec_id, worker=worker.id, session_id=session_id)
        cells = [  # recorded as a session's cells are, when the map keeps a journal (sweeps)
            ExecRequest(
                exec_id=f"{item.exec_id}-{n}",
                session_id=session_id,
                code=code,
                timeout_s=item.timeout_s,
                epoch=0,
                generation=worker.generation,
            )
            for n, code in enumerate(item.cells)
            if chunk.journal
        ]
        recorders = {c.exec_id: ExecRecorder(worker.journal, c, worker.id) for c in cells}

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
                    wait_s=KERNEL_WAIT_S,
                )
            outcome = ItemResults.from_kernel(reply, worker.id, item.timeout_s)
        except KernelRequestError as exc:
            if exc.code in ROOMLESS_CODES:  # nothing ran: its client sends it again
                done.retry = f"worker {worker.id} had no room for it: {exc}"
                return done
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
        done.queue_s = reply.get("queue_s", 0.0)
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
