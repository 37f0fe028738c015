"""The farm's shared state in Redis: live workers, session owners, and exec records.

Keys live under ``farm:``. A worker's hash expires with its heartbeat (no key = dead worker)
and a session's when idle; an ``exec:<id>`` record is claimed with ``SET NX``, so a message's
code runs once. The key layout and why: docs/design/delivery-and-fencing.md.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import redis

from farm.events.exec_finish import Finisher, Reply

if TYPE_CHECKING:
    from farm.events.journal import Entries
    from farm.settings import FarmSettings

PREFIX = "farm:"
MOVED = "the session moved to worker "  # a state no outage explains: follow it at once
# An exec record (claim, then the result) only has to outlive redeliveries of its message
# (within the broker's visibility timeout, 60 s) and a client's wait; a day of them cost ~0.5 kB
# an exec of Redis memory (a million-exec day: 500 MB). One hour, as Celery's results.
EXEC_TTL_S = 3600
# A map item's claim is never answered with a result (that goes to its map's list): it only has
# to outlive the item's run and the minutes in which its map may send a copy of it again.
ITEM_CLAIM_S = 600
ANSWER_TTL_S = 300  # an open's answer its client never read (it gave up) expires
BROKER_MARK = f"{PREFIX}broker"
MAX_CONNECTIONS = 1024  # a process's connections to the registry at once
POOL_WAIT_S = 30.0  # past them, how long a command waits for one to be free


class Registry:
    def __init__(
        self, url: str, *, heartbeat_ttl_s: float = 3.0, tls: Mapping[str, Any] | None = None
    ) -> None:
        # A pool that waits for a free connection rather than failing: redis-py's own stops
        # at 100 connections with an error, which a worker's or farm serve's threads at once
        # (items, opens, calls) would reach under load.
        pool = redis.BlockingConnectionPool.from_url(
            url,
            decode_responses=True,
            socket_timeout=10,
            max_connections=MAX_CONNECTIONS,
            timeout=POOL_WAIT_S,
            **(tls or {}),
        )
        self.redis = redis.Redis(connection_pool=pool)
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self._blmpop = True  # until the server says it has no BLMPOP (Redis < 7)
        self._finisher = Finisher(self.redis)

    @classmethod
    def connect(cls, settings: FarmSettings) -> Registry:
        """The registry of the broker ``settings`` name, with its password and TLS options
        (the same ones Celery's app gets: ``farm.celeryconf.make_app``)."""
        return cls(
            settings.redis_url, heartbeat_ttl_s=settings.heartbeat_ttl_s, tls=settings.redis_tls
        )

    def close(self) -> None:
        self.redis.close()
        self.redis.connection_pool.disconnect()  # a pool given to Redis is not closed by it

    # --- the broker's data set -----------------------------------------------------------

    def broker_mark(self) -> str:
        """The mark of the data set this broker holds now (created here when missing).

        A restart with persistence keeps it; anything that loses queues and records (a
        restart without persistence, FLUSHALL, a failover to an empty replica) changes it.
        """
        seen: Any = self.redis.get(BROKER_MARK)
        return self._mark(seen)

    def _mark(self, seen: str | None) -> str:
        """``seen`` (the mark as read), or, when there was none, the mark made now: a second
        round trip only for the first reader after the data set was lost."""
        if seen is not None:
            return str(seen)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(BROKER_MARK, uuid.uuid4().hex, nx=True)
            pipe.get(BROKER_MARK)
            _, mark = pipe.execute()
        return str(mark)

    # --- workers --------------------------------------------------------------------------

    def next_generation(self, worker_id: str) -> int:
        return int(self.redis.incr(f"{PREFIX}gen:{worker_id}"))

    def heartbeat(self, worker_id: str, fields: dict[str, Any]) -> None:
        key = f"{PREFIX}worker:{worker_id}"
        flat: dict[Any, Any] = {
            k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()
        }
        flat["heartbeat"] = str(time.time())
        with self.redis.pipeline() as pipe:
            pipe.hset(key, mapping=flat)
            pipe.pexpire(key, int(self.heartbeat_ttl_s * 1000))
            pipe.sadd(f"{PREFIX}workers", worker_id)
            pipe.execute()

    def deregister(self, worker_id: str, generation: int) -> None:
        key = f"{PREFIX}worker:{worker_id}"
        if self.redis.hget(key, "generation") == str(generation):
            self.redis.delete(key)
            self.redis.srem(f"{PREFIX}workers", worker_id)

    def worker(self, worker_id: str) -> dict[str, Any] | None:
        raw = self.redis.hgetall(f"{PREFIX}worker:{worker_id}")
        return _decode(raw) if raw else None

    def workers(self) -> list[dict[str, Any]]:
        ids = sorted(str(member) for member in self.redis.smembers(f"{PREFIX}workers"))
        with self.redis.pipeline(transaction=False) as pipe:
            for worker_id in ids:
                pipe.hgetall(f"{PREFIX}worker:{worker_id}")
            hashes = pipe.execute()
        gone = [worker_id for worker_id, raw in zip(ids, hashes, strict=True) if not raw]
        if gone:
            self.redis.srem(f"{PREFIX}workers", *gone)
        return [_decode(raw) for raw in hashes if raw]

    def ready_among(self, worker_ids: list[str]) -> set[str]:
        """Which of ``worker_ids`` are registered ready: one small read, cheap to poll."""
        with self.redis.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hget(f"{PREFIX}worker:{worker_id}", "ready")
            flags = pipe.execute()
        return {w for w, flag in zip(worker_ids, flags, strict=True) if flag == "true"}

    def worker_alive(self, worker_id: str, generation: int) -> bool:
        return self.redis.hget(f"{PREFIX}worker:{worker_id}", "generation") == str(generation)

    def session_state(
        self, session_id: str, worker_id: str, generation: int
    ) -> tuple[str | None, str]:
        """(``None`` when the session can take calls, else why not; the broker's mark), in
        one round trip: a call about to be sent needs both."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(f"{PREFIX}worker:{worker_id}", "generation")
            pipe.hmget(f"{PREFIX}session:{session_id}", ["worker", "generation"])
            pipe.get(BROKER_MARK)
            live_generation, owner, seen = pipe.execute()
        mark = self._mark(seen)
        if owner[0] is not None and owner != [worker_id, str(generation)]:
            return f"{MOVED}{owner[0]}", mark
        if live_generation != str(generation):
            return f"worker {worker_id} (generation {generation}) is gone", mark
        if owner[0] is None:
            return "the session was closed or expired after being idle", mark
        return None, mark

    def queue_length(self, queue: str) -> int:
        """Messages waiting in a broker queue (kombu's Redis transport keeps one list each)."""
        return int(self.redis.llen(queue))

    def dead_direct_queues(self) -> list[str]:
        """Direct queues (``farm.w.<id>.g<n>``) of worker generations that are gone.

        Messages left there are never run by a successor (it consumes its own queue); this
        finds them so ``farm gc`` can drop them instead of letting them pile up.
        """
        dead = []
        for key in self.redis.scan_iter("farm.w.*"):
            worker_id, _, gen = key.removeprefix("farm.w.").rpartition(".g")
            if gen.isdigit() and not self.worker_alive(worker_id, int(gen)):
                dead.append(key)
        return dead

    def drop_queues(self, queues: list[str]) -> int:
        return int(self.redis.delete(*queues)) if queues else 0

    # --- sessions -------------------------------------------------------------------------

    def put_session(self, session_id: str, fields: dict[str, Any], ttl_s: float) -> None:
        with self.redis.pipeline() as pipe:
            self._put_session(pipe, session_id, fields, ttl_s)
            pipe.execute()

    @staticmethod
    def _put_session(pipe: Any, session_id: str, fields: dict[str, Any], ttl_s: float) -> None:
        key = f"{PREFIX}session:{session_id}"
        pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
        pipe.pexpire(key, int(ttl_s * 1000))

    def session(self, session_id: str) -> dict[str, Any] | None:
        raw = self.redis.hgetall(f"{PREFIX}session:{session_id}")
        return _decode(raw) if raw else None

    def drop_session(self, session_id: str) -> None:
        self.redis.delete(f"{PREFIX}session:{session_id}")

    def sessions(self) -> list[dict[str, Any]]:
        found = []
        for key in self.redis.scan_iter(f"{PREFIX}session:*"):
            raw = self.redis.hgetall(key)
            if raw:
                found.append({"id": key.removeprefix(f"{PREFIX}session:"), **_decode(raw)})
        return found

    # --- exec records -------------------------------------------------------------------

    def claim_exec(
        self,
        exec_id: str,
        worker_id: str,
        generation: int,
        timeout_s: float = 0.0,
        keep_s: int = EXEC_TTL_S,
    ) -> dict[str, Any] | None:
        """Claim ``exec_id`` for running (the claim outlives a run of ``timeout_s`` by
        ``keep_s``); ``None`` if claimed, else the existing record."""
        record = {"state": "running", "worker": worker_id, "generation": generation}
        if self._record_first(exec_id, record, keep_s + int(timeout_s)):
            return None
        return self.exec_record(exec_id) or record

    def claim_chunk(self, chunk_id: str, worker_id: str, generation: int) -> bool:
        """Claim a batch chunk for this worker (False: claimed, or abandoned, before)."""
        record = {"state": "running", "worker": worker_id, "generation": generation}
        return self._record_first(chunk_id, record)

    def abandon(self, exec_id: str) -> bool:
        """Claim ``exec_id`` for nobody, so that no worker ever runs it; False when a worker
        claimed it first (then it runs, or ran, there)."""
        return self._record_first(exec_id, {"state": "abandoned"})

    def _record_first(self, exec_id: str, record: dict[str, Any], ttl_s: int = EXEC_TTL_S) -> bool:
        """Write ``exec_id``'s record unless it has one: whoever writes first owns it."""
        key = f"{PREFIX}exec:{exec_id}"
        return bool(self.redis.set(key, json.dumps(record), nx=True, ex=ttl_s))

    def finish_exec(
        self,
        exec_id: str,
        result: dict[str, Any],
        session: tuple[str, dict[str, Any], float] | None = None,
        events: Entries | None = None,
        reply: Callable[[str], Reply] | None = None,
    ) -> str:
        """Record the outcome; with ``session`` (id, fields, ttl) also refresh that session's
        entry, and add the run's last ``events`` to its journal first, and with ``reply`` (from
        the result's JSON: key, body, ttl) store and publish its task's result last, all in one
        script (``farm.events.exec_finish``): one round trip, the result encoded once. Returns
        the journal's error, or ``""``."""
        encoded = json.dumps(result)
        record = f'{{"state": "done", "result": {encoded}}}'
        exec_record = (f"{PREFIX}exec:{exec_id}", record, EXEC_TTL_S)
        stored = reply(encoded) if reply is not None else None
        return self._finisher.finish(exec_record, _keyed(session), events, stored)

    def finish_branch(
        self,
        result: dict[str, Any],
        session: tuple[str, dict[str, Any], float] | None,
        events: Entries,
        reply: Callable[[str], Reply] | None = None,
    ) -> str:
        """The end of a branch op (a checkpoint, rollback, drop or fork: no exec record) in the
        same one script as ``finish_exec``: its journal event, the session's entry (its epoch),
        then its task's result. Returns the journal's error, or ``""``."""
        stored = reply(json.dumps(result)) if reply is not None else None
        return self._finisher.finish(None, _keyed(session), events, stored)

    def exec_record(self, exec_id: str) -> dict[str, Any] | None:
        raw = self.redis.get(f"{PREFIX}exec:{exec_id}")
        return json.loads(raw) if raw else None

    # --- a map's results ---------------------------------------------------------------

    def pop_results(self, key: str, block_s: float, count: int) -> list[str]:
        """Up to ``count`` entries from the head of a map's result list, waiting up to
        ``block_s`` for the first: one ``BLMPOP`` per wake-up on Redis >= 7, else ``BLPOP``
        then ``LPOP`` (two commands)."""
        if self._blmpop:
            try:
                found = self.redis.blmpop(block_s, 1, key, direction="LEFT", count=count)
            except redis.ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._blmpop = False
            else:
                return [str(body) for body in found[1]] if found else []
        first = self.redis.blpop([key], timeout=block_s)
        if first is None:
            return []
        more = self.redis.lpop(key, count - 1) if count > 1 else None
        return [first[1], *(more or [])]

    # --- the chunks waiting for a worker with room -----------------------------------------

    def push_chunk(self, key: str, body: str) -> tuple[int, int]:
        """Queue a map chunk on list ``key`` (``chunks_key``); returns how many chunks are
        ahead of it and below it (its place: it is taken once ``taken`` has grown by that)
        and the list's ``taken`` count as it was queued, read in the same transaction."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, body)
            pipe.get(taken_key(key))
            length, taken = pipe.execute()
        return int(length), int(taken or 0)

    def pop_work(self, keys: list[str], block_s: float) -> tuple[str, str] | None:
        """The oldest entry of the first of ``keys`` that has one (a list of opens before one
        of chunks: an open goes first), waiting up to ``block_s``: ``(key, body)``. A chunk is
        counted as taken (a client whose chunk's turn came and went without a claim sends it
        again)."""
        found = self.redis.brpop(keys, timeout=block_s)
        if found is None:
            return None
        key, body = str(found[0]), str(found[1])
        if key.endswith(".chunks"):
            self.redis.incr(taken_key(key))
        return key, body

    # --- session opens waiting for a worker with room -------------------------------------

    def push_open(self, key: str, body: str) -> None:
        """Queue a session open (an ``OpenRequest``'s JSON) on list ``key`` (``opens_key``)."""
        self.redis.lpush(key, body)

    def take_back(self, key: str, body: str) -> bool:
        """Take a queued entry (an open its client gave up) back out of list ``key``: whether
        it was still there."""
        return bool(self.redis.lrem(key, 1, body))

    def answer(self, key: str, body: str, ttl_s: int = ANSWER_TTL_S) -> None:
        """Push ``body`` on list ``key`` for whoever waits on it (``wait_answer``): an open's
        answer on its client's list, a run on its lane or its reply; unread, the list expires."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.rpush(key, body)
            pipe.expire(key, ttl_s)
            pipe.execute()

    def wait_answer(self, key: str, block_s: float) -> str | None:
        """The next answer on list ``key``, waiting up to ``block_s`` for one."""
        found = self.redis.blpop([key], timeout=block_s)
        return None if found is None else str(found[1])


def opens_key(queue: str) -> str:
    """The list of session opens for the workers of an image's ``queue``: a worker takes the
    oldest when it has room for a session's box, ahead of any map chunk."""
    return f"{queue}.opens"


def answers_key(client_id: str) -> str:
    """The list the answers to one client's opens come on (each names its open)."""
    return f"{PREFIX}answers:{client_id}"


def chunks_key(queue: str) -> str:
    """The list of map chunks for the workers of an image's ``queue``: a worker takes the
    oldest when it has room (``farm.worker.intake``), so its length is the batch backlog."""
    return f"{queue}.chunks"


def taken_key(chunks: str) -> str:
    """How many chunks were ever taken from list ``chunks`` (a chunk's turn has come once
    this passed its place)."""
    return f"{PREFIX}taken:{chunks}"


def cancel_key(map_id: str) -> str:
    """Set by a client that stopped reading a map: its workers start nothing more of it."""
    return f"{PREFIX}map:{map_id}:cancel"


def results_key(map_id: str) -> str:
    """The list a map's workers push each item's result to, as it ends."""
    return f"{PREFIX}map:{map_id}:results"


def _decode(raw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _keyed(
    session: tuple[str, dict[str, Any], float] | None,
) -> tuple[str, dict[str, Any], float] | None:
    """A session's entry (id, fields, ttl) with its registry key in place of its id."""
    if session is None:
        return None
    session_id, fields, ttl_s = session
    return f"{PREFIX}session:{session_id}", fields, ttl_s
