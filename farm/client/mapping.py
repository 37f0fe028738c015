"""``Farm.map``: many items through a farm, each in a box of its own, as one engine.

Items are read lazily and sent in growing chunks; at most ``concurrency`` items are between
being read and being yielded (memory stays flat). Every item ends in exactly one record:
an unclaimed chunk is sent again (a late copy runs nothing), a dead worker's unstarted items
keep their exec ids, started ones are retried as ``infra``; leaving the loop cancels the map.
Why and how: docs/design/map-engine.md.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic_core import PydanticSerializationError

from farm.client.map_records import (
    Item,
    chunk_item,
    failed,
    manifest,
    outcome,
    parse_item,
    unsendable,
)
from farm.errors import BrokerLost, BrokerUnavailable, ProblemError, SandboxUnavailable
from farm.image_name import ImageName
from farm.judge import image_for
from farm.judge.problems import Problem
from farm.models import ErrorKind
from farm.models.batch import BatchItem, BatchRecord, Chunk, ChunkItem, ItemDone
from farm.registry import BROKER_MARK, PREFIX, cancel_key, chunks_key, results_key, taken_key

if TYPE_CHECKING:
    from farm.client.broker import Broker
    from farm.events.run_events import Event
    from farm.registry import Registry

MAX_CHUNK = 64
TAKEN_WAIT_S = 2.0  # unclaimed this long after its turn came: its taker died, sent again
CHECK_EVERY_S = 1.0
BLOCK_S = 0.25
DRAIN = 256
CANCEL_TTL_S = 3600
RETRYABLE = {ErrorKind.SANDBOX_LOST.value, ErrorKind.INFRA.value}
REFUSED_PAUSE_S = 0.05  # an item a worker had no room for is sent again after this, doubling
REFUSED_PAUSE_MAX_S = 2.0


class MapHost(Protocol):
    """What a ``MapRun`` needs of its farm (``Farm`` is one): the broker it sends through,
    the registry it reads, the live workers, an image served, a session's journal."""

    @property
    def broker(self) -> Broker: ...

    @property
    def registry(self) -> Registry: ...

    def workers(self) -> list[dict[str, Any]]: ...

    def require_image(self, image: str | ImageName) -> None: ...

    def replay(self, session_id: str) -> Iterator[Event]: ...

    def put_problem(self, problem: Problem, *, again: bool = False) -> str: ...


@dataclass
class _Attempt:
    key: int
    item: BatchItem
    exec_id: str
    chunk_id: str = ""
    attempts: int = 1
    started: float = field(default_factory=time.perf_counter)
    queue_s: float = 0.0  # waited for room, in the sends before this one
    refusals: int = 0  # sends a worker had no room for (never counted as attempts)


@dataclass
class _Chunk:
    chunk_id: str
    keys: set[int]
    queue: str  # the list of chunks it waits in (``chunks_key``)
    place: int  # it is taken once the list's taken count grew by this much since ``taken``
    taken: int
    body: str  # as queued: what a cancelled map takes back out of the list
    due_at: float | None = None  # when its turn was seen to have come (claimed soon after)


class MapRun:
    """One ``Farm.map`` call: iterate it for ``BatchRecord``s; ``close()`` cancels it."""

    def __init__(
        self,
        farm: MapHost,
        items: Iterable[Item],
        *,
        image: str | ImageName = "default",
        concurrency: int | None = None,
        timeout_s: float = 30.0,
        retries: int = 0,
        ordered: bool = True,
        journal: bool = False,
        on_sent: Callable[[int], None] | None = None,
        egress: list[str] | None = None,
    ) -> None:
        self.farm = farm
        self.image = ImageName.parse(image).asked  # a bad name fails before anything is sent
        self.egress = egress  # hosts every item's box may reach, unless the item says
        self.timeout_s = timeout_s
        self.retries = retries
        self.ordered = ordered
        self.journal = journal
        self.on_sent = on_sent
        self.map_id = uuid.uuid4().hex
        self.results = results_key(self.map_id)
        self._source = enumerate(items)
        self._ahead: list[tuple[int, Item]] = []  # read from the source, not yet sent
        self._exhausted = False  # the source has no more items
        # image -> why no worker serves it (None: one does), asked at the first item that
        # names it: a map whose items all name other images needs no worker of ``image``
        self._images: dict[str, str | None] = {}
        self.workers = {str(w["id"]): w for w in farm.broker.call(farm.workers, sent=False)}
        serving = [w for w in self.workers.values() if w.get("image") == self.image]
        boxes = [int(w.get("capacity") or 1) for w in serving] or [8]
        self.concurrency = max(1, concurrency or min(sum(boxes), 256))
        # A chunk is at most half the smallest worker's room: a worker takes one when it has
        # a free box, so it never holds more than its capacity plus one chunk.
        fair = self.concurrency // (2 * max(1, len(serving)))
        self._per_worker = max(1, min(fair, min(boxes) // 2))
        self._later: list[tuple[float, _Attempt]] = []  # refused for want of room: sent again
        self._pending: dict[int, _Attempt] = {}
        self._chunks: dict[str, _Chunk] = {}
        self._ready: dict[int, BatchRecord] = {}
        self._next = 0  # the key ordered mode yields next
        self._sent_chunks = 0
        self._checked = time.monotonic()
        self._mark = farm.broker.call(farm.registry.broker_mark, sent=False)
        self._done = False

    # --- the loop --------------------------------------------------------------------------

    def __iter__(self) -> Iterator[BatchRecord]:
        try:
            while True:
                self._send_later()
                self._fill()
                yield from self._yieldable()
                if self._exhausted and not (self._ahead or self._pending or self._ready):
                    self._done = True
                    return
                self._receive()
                if self._done:  # closed meanwhile, from another thread (a cancelled async map)
                    return
                if time.monotonic() - self._checked >= CHECK_EVERY_S:
                    self._check()
        except BrokerUnavailable:
            self._end_pending(ErrorKind.INFRA, "BrokerUnavailable", "the broker went away")
            yield from self._yieldable(flush=True)
            raise
        finally:
            if not self._done:
                self.close()

    def __enter__(self) -> MapRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel what was not yet done: nothing more is sent or started, running items stop."""
        if self._done:
            return
        self._done = True
        self._exhausted = True
        self._ahead = []
        farm = self.farm
        chunks = list(self._chunks.values())

        def cancel() -> None:  # and its chunks no worker took yet leave the lists at once
            with farm.registry.redis.pipeline(transaction=False) as pipe:
                pipe.set(cancel_key(self.map_id), 1, ex=CANCEL_TTL_S)
                pipe.expire(self.results, 60)
                for chunk in chunks:
                    pipe.lrem(chunk.queue, 1, chunk.body)
                pipe.execute()

        farm.broker.quietly(cancel)

    # --- sending -------------------------------------------------------------------------

    def _fill(self) -> None:
        """Send chunks while the window has room for a whole one and the source has items.

        Waiting for a whole chunk's room matters: room opens one item at a time as results
        come back, and sending whatever fits made most chunks one item long in steady state,
        each paying a chunk's ~13 Redis commands (docs/scaling.md). The next chunk's items are
        read ahead (at most ``MAX_CHUNK``), so the source's last, shorter chunk goes as soon
        as it fits instead of waiting for a whole chunk's room."""
        while True:
            size = min(MAX_CHUNK, self._per_worker, 2**self._sent_chunks)
            if not self._exhausted and len(self._ahead) < size:
                self._ahead += itertools.islice(self._source, size - len(self._ahead))
                self._exhausted = len(self._ahead) < size
            room = self.concurrency - len(self._pending) - len(self._ready)
            if not self._ahead or room < len(self._ahead):
                return
            batch = []
            for key, raw in self._ahead:
                item = self._parse(key, raw)  # a bad item's record goes to _ready
                if item is not None:
                    batch.append(_Attempt(key, item, uuid.uuid4().hex))
            self._ahead = []
            for image in dict.fromkeys(self._image(a) for a in batch):  # each image's chunk
                self._send([a for a in batch if self._image(a) == image])

    def _image(self, attempt: _Attempt) -> str:
        return image_for(attempt.item, self.image)

    def _served(self, attempt: _Attempt) -> bool:
        """Whether a worker serves the item's image (a local farm starts one); if not, the
        item's record says so (kind ``infra``) and it is not sent."""
        image = self._image(attempt)
        if image not in self._images:
            try:
                self.farm.require_image(image)
            except SandboxUnavailable as exc:
                self._images[image] = str(exc)
            else:
                self._images[image] = None
        why = self._images[image]
        if why is not None:
            self._pending.pop(attempt.key, None)
            self._ready[attempt.key] = BatchRecord(
                id=attempt.item.id, status="error", kind=ErrorKind.INFRA.value, message=why
            )
        return why is None

    def _parse(self, key: int, raw: Item) -> BatchItem | None:
        """The item (a judge item's ``Problem`` stored, the item naming it by digest), or
        ``None`` with its record of why not in ``_ready``."""
        parsed = parse_item(key, raw)
        if isinstance(parsed, BatchItem) and isinstance(parsed.problem, Problem):
            try:  # once per client: the farm remembers what it stored
                digest = self.farm.put_problem(parsed.problem)
            except ProblemError as exc:
                parsed = BatchRecord(id=parsed.id, status="error", kind="input", message=str(exc))
            else:
                parsed = parsed.model_copy(update={"problem": digest})
        if isinstance(parsed, BatchRecord):
            self._ready[key] = parsed
            return None
        return parsed

    def _send(self, batch: list[_Attempt]) -> None:
        """Queue ``batch`` (items of one image) as one chunk on that image's list of chunks,
        which a worker takes when it has room."""
        batch = [attempt for attempt in batch if self._served(attempt)]
        if not batch:
            return
        queue = chunks_key(ImageName(self._image(batch[0])).queue)
        chunk_id = uuid.uuid4().hex
        payload = Chunk(
            map_id=self.map_id,
            chunk_id=chunk_id,
            results=self.results,
            journal=self.journal,
            items=[self._chunk_item(attempt) for attempt in batch],
            sent_at=time.time(),
        )
        try:
            body = payload.model_dump_json()
        except PydanticSerializationError:  # an item's text is not UTF-8: its own record
            self._send(self._sendable(batch, payload.items))
            return
        place, taken = self.farm.broker.queue_chunk(queue, body)
        keys = {a.key for a in batch}
        self._chunks[chunk_id] = _Chunk(chunk_id, keys, queue, place, taken, body)
        for attempt in batch:
            attempt.chunk_id = chunk_id
            self._pending[attempt.key] = attempt
        self._sent_chunks += 1
        if self.on_sent is not None:
            self.on_sent(len(batch))

    def _sendable(self, batch: list[_Attempt], items: list[ChunkItem]) -> list[_Attempt]:
        """``batch`` without the items that cannot travel, each given its ``input`` record."""
        kept = []
        for attempt, chunk in zip(batch, items, strict=True):
            record = unsendable(attempt.key, attempt.item, chunk)
            if record is None:
                kept.append(attempt)
            else:
                self._ready[attempt.key] = record
        if len(kept) == len(batch):
            raise RuntimeError("a chunk failed to serialize, yet each of its items does")
        return kept

    def _chunk_item(self, attempt: _Attempt) -> ChunkItem:
        return chunk_item(attempt.key, attempt.exec_id, attempt.item, self.timeout_s, self.egress)

    # --- receiving -----------------------------------------------------------------------

    def _receive(self) -> None:
        if not self._pending:
            return
        registry = self.farm.registry
        bodies = self.farm.broker.call(
            lambda: registry.pop_results(self.results, BLOCK_S, DRAIN), sent=True
        )
        for body in bodies:
            self._finished(ItemDone.model_validate_json(body))

    def _finished(self, done: ItemDone) -> None:
        attempt = self._pending.get(done.key)
        if attempt is None or attempt.exec_id != done.exec_id:
            return  # an attempt given up on meanwhile (its worker was taken for dead)
        chunk = self._chunks.get(attempt.chunk_id)
        if chunk is not None:
            chunk.keys.discard(done.key)
            if not chunk.keys:
                del self._chunks[attempt.chunk_id]
        if done.retry is not None:  # no room for it after all: nothing ran, not an attempt
            self._refused(attempt, done)
            return
        _, kind, _ = outcome(done)
        if kind in RETRYABLE and attempt.attempts <= self.retries:
            self._retry(attempt, done)
            return
        del self._pending[done.key]
        self._ready[done.key] = self._record(attempt, done)

    def _again(self, attempt: _Attempt, done: ItemDone, *, refused: bool) -> _Attempt:
        """The item's next attempt (a new exec id: the last one was claimed), keeping when
        it started and how long it waited for room."""
        again = _Attempt(
            attempt.key,
            attempt.item,
            uuid.uuid4().hex,
            attempts=attempt.attempts if refused else attempt.attempts + 1,
            started=attempt.started,
            queue_s=attempt.queue_s + done.queue_s,
            refusals=attempt.refusals + refused,
        )
        self._pending[attempt.key] = again
        return again

    def _retry(self, attempt: _Attempt, done: ItemDone) -> None:
        self._send([self._again(attempt, done, refused=False)])

    def _refused(self, attempt: _Attempt, done: ItemDone) -> None:
        """Send the item again after a pause that doubles with each refusal: a farm with no
        room is waited for, never flooded; ``retries`` count the user's failures, not these."""
        again = self._again(attempt, done, refused=True)
        pause = min(REFUSED_PAUSE_S * 2 ** (again.refusals - 1), REFUSED_PAUSE_MAX_S)
        self._later.append((time.monotonic() + pause, again))

    def _send_later(self) -> None:
        """Send the refused items whose pause is over, a chunk per image."""
        now = time.monotonic()
        due = [attempt for at, attempt in self._later if at <= now]
        if not due:
            return
        self._later = [(at, attempt) for at, attempt in self._later if at > now]
        for image in dict.fromkeys(self._image(a) for a in due):
            self._send([a for a in due if self._image(a) == image])

    def _record(self, attempt: _Attempt, done: ItemDone) -> BatchRecord:
        is_failure, kind, message = outcome(done)
        record = BatchRecord(
            id=attempt.item.id,
            status="error" if is_failure else "ok",
            kind=kind,
            message=message,
            cells=done.cells,
            command=done.command,
            judge=done.judge,  # scored by its worker, which has its problem's groups
            attempts=attempt.attempts,
            duration_s=time.perf_counter() - attempt.started,
            queue_s=attempt.queue_s + done.queue_s,
            manifest=self._manifest(done.worker, self._image(attempt)),
        )
        if done.egress:  # what the result depended on, beyond its own box
            record.manifest["egress"] = done.egress
        if self.journal and done.session_id:
            from farm.events.transcripts import mime_stream

            record.journal = self.farm.broker.quietly(
                lambda: list(mime_stream(self.farm.replay(done.session_id)))
            )
        return record

    def _manifest(self, worker_id: str, image: str) -> dict[str, Any]:
        worker = self.workers.get(worker_id)
        if worker is None:  # started after the map did
            registry = self.farm.registry
            worker = self.farm.broker.quietly(lambda: registry.worker(worker_id)) or {}
            self.workers[worker_id] = worker
        return manifest(worker_id, worker, image)

    def _yieldable(self, flush: bool = False) -> Iterator[BatchRecord]:
        """Records ready to go: in any order, or in the items' order (every key ends in
        ``_ready`` once: as a result, or as a bad item's record)."""
        if not self.ordered or flush:
            for key in sorted(self._ready):
                yield self._ready.pop(key)
            return
        while self._next in self._ready:
            yield self._ready.pop(self._next)
            self._next += 1

    # --- watching ------------------------------------------------------------------------

    def _check(self) -> None:
        """One round trip: the broker's mark, each list's taken count and length, each open
        chunk's claim, then the pulse of each claiming worker. A chunk waits in its list as
        long as its turn has not come (a farm with no room is waited for); once it has, it is
        claimed within milliseconds, so one still unclaimed after ``TAKEN_WAIT_S`` was taken
        by a worker that died before claiming it, and is sent again."""
        self._checked = time.monotonic()
        registry = self.farm.registry
        chunks = list(self._chunks.values())
        queues = sorted({chunk.queue for chunk in chunks})

        def read() -> list[Any]:
            with registry.redis.pipeline(transaction=False) as pipe:
                pipe.get(BROKER_MARK)
                for queue in queues:
                    pipe.get(taken_key(queue))
                    pipe.llen(queue)
                if chunks:
                    pipe.mget([f"{PREFIX}exec:{chunk.chunk_id}" for chunk in chunks])
                return list(pipe.execute())

        mark, *rest = self.farm.broker.call(read, sent=True)
        if mark != self._mark:
            why = "the broker lost its data while the map waited: the items may or may not have run"
            self._end_pending(ErrorKind.INFRA, BrokerLost.__name__, why)
            return
        lists = {q: (int(rest[2 * n] or 0), int(rest[2 * n + 1])) for n, q in enumerate(queues)}
        claims = rest[2 * len(queues)] if chunks else []
        alive: dict[tuple[str, int], bool] = {}
        for chunk, raw in zip(chunks, claims, strict=True):
            claim = json.loads(raw) if raw else None
            if claim is None:
                taken, length = lists[chunk.queue]
                if taken - chunk.taken < chunk.place and length:
                    continue  # still in the list, its turn to come
                chunk.due_at = chunk.due_at or self._checked
                waited = self._checked - chunk.due_at
                if waited > TAKEN_WAIT_S and registry.abandon(chunk.chunk_id):
                    self._resend(chunk, started=set())
            elif claim.get("state") == "running":
                owner = (str(claim["worker"]), int(claim["generation"]))
                if owner not in alive:
                    alive[owner] = self._alive(owner)
                if not alive[owner]:
                    self._lost_worker(chunk, owner)

    def _alive(self, owner: tuple[str, int]) -> bool:
        registry = self.farm.registry
        return self.farm.broker.after_outage(lambda: registry.worker_alive(*owner), bool)

    def _resend(self, chunk: _Chunk, started: set[int]) -> None:
        """Send a chunk's items again (same exec ids: those that never ran)."""
        del self._chunks[chunk.chunk_id]
        again = [self._pending[key] for key in sorted(chunk.keys) if key not in started]
        if again:
            self._send(again)

    def _lost_worker(self, chunk: _Chunk, owner: tuple[str, int]) -> None:
        registry = self.farm.registry
        keys = sorted(chunk.keys)
        records = self.farm.broker.call(
            lambda: [registry.exec_record(self._pending[key].exec_id) for key in keys], sent=True
        )
        started = {key for key, record in zip(keys, records, strict=True) if record}
        why = f"worker {owner[0]} (generation {owner[1]}) died while the item ran"
        for key in started:
            exec_id = self._pending[key].exec_id
            chunk.keys.discard(key)
            self._finished(
                failed(key, exec_id, owner[0], ErrorKind.SANDBOX_LOST, "SessionLost", why)
            )
        if chunk.chunk_id in self._chunks:
            self._resend(chunk, started)

    def _end_pending(self, kind: ErrorKind, ename: str, why: str) -> None:
        for key, attempt in sorted(self._pending.items()):
            done = failed(key, attempt.exec_id, "", kind, ename, why)
            self._ready[key] = self._record(attempt, done)
        self._pending.clear()
        self._chunks.clear()
        self._later = []
        self._ahead = []
        self._exhausted = True
