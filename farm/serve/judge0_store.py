"""The ``/judge0`` submissions of every ``farm serve`` of one farm, in the broker's Redis: they
outlive a server's restart, and its replicas share them (and their queue).

Keys (``farm:judge0:``): ``sub:<token>`` a hash (``owner``, ``doc``, ``files``, ``status_id``,
``attempts``, then ``result``), expiring ``judge0_ttl_s`` after it was made; ``pending`` the
queue, each element a submission's token or a batch's, comma-joined; ``claimed:<replica>``
what a server took from it; ``alive:<replica>`` its heartbeat (``ALIVE_S``); ``replicas``.
A dead server's claims go back to the queue (any other moves them); a submission cut off
``MAX_ATTEMPTS`` times ends as Internal Error. Why: docs/design/judge.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from farm.models.batch import BatchRecord
from farm.registry import PREFIX
from farm.serve.problem_documents import ProblemError

if TYPE_CHECKING:
    import redis

KEYS = f"{PREFIX}judge0:"
PENDING = f"{KEYS}pending"
REPLICAS = f"{KEYS}replicas"
ALIVE_S = 10.0  # a server unheard of this long has its claims queued again
MAX_ATTEMPTS = 3  # judgings of one submission cut off by a server's end, then Internal Error
MAX_PENDING = 100_000  # queued elements past which a new submission is a 503

# Each only on a submission that still exists: one deleted (or expired) is never made again,
# without its expiry, by a late finish or start.
_START = """
if redis.call('exists', KEYS[1]) == 0 then return false end
local attempts = redis.call('hincrby', KEYS[1], 'attempts', 1)
redis.call('hset', KEYS[1], 'status_id', 2)
return {attempts, redis.call('hget', KEYS[1], 'doc'), redis.call('hget', KEYS[1], 'files')}
"""
_FINISH = """
if redis.call('exists', KEYS[1]) == 0 then return 0 end
redis.call('hset', KEYS[1], 'result', ARGV[1], 'finished_at', ARGV[2])
redis.call('hdel', KEYS[1], 'files')
return 1
"""


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _sub(token: str) -> str:
    return f"{KEYS}sub:{token}"


def _claimed(replica: str) -> str:
    return f"{KEYS}claimed:{replica}"


def _alive(replica: str) -> str:
    return f"{KEYS}alive:{replica}"


@dataclass
class Entry:
    """A stored submission: its owner's token id, the request, its result once judged."""

    owner: str
    doc: dict[str, Any]
    status_id: int  # 1 queued, 2 being judged; finished when ``result`` is set
    result: BatchRecord | None
    finished_at: str | None


@dataclass
class Started:
    """A submission a server begins to judge: its request and files, the how-many-th time."""

    token: str
    doc: dict[str, Any]
    files: dict[str, str]
    attempts: int


class Judge0Store:
    """Submissions by token, each with its owner; their queue and the servers' claims."""

    def __init__(self, redis: redis.Redis, ttl_s: float) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self._start = redis.register_script(_START)
        self._finish = redis.register_script(_FINISH)

    def add(
        self, owner: str, made: list[tuple[dict[str, Any], dict[str, str]]], held_by: str = ""
    ) -> str:
        """Store submissions (each its request and files) and, in the same transaction, queue
        them as one element (one map), or claim them for server ``held_by`` (``wait=true``):
        none is ever stored but in no list, to stay queued for good. The element."""
        element = ",".join(doc["token"] for doc, _ in made)
        with self.redis.pipeline() as pipe:  # MULTI/EXEC
            for doc, files in made:
                key = _sub(doc["token"])
                fields: dict[str, str | int] = {
                    "owner": owner,
                    "doc": json.dumps(doc),
                    "status_id": 1,
                    "attempts": 0,
                }
                if files:
                    fields["files"] = json.dumps(files)
                pipe.hset(key, mapping=fields)  # type: ignore[arg-type]  # its keys: invariant
                pipe.expire(key, int(self.ttl_s))
            pipe.rpush(_claimed(held_by) if held_by else PENDING, element)
            pipe.execute()
        return element

    def check_room(self) -> None:
        if int(self.redis.llen(PENDING)) >= MAX_PENDING:
            why = f"the queue holds {MAX_PENDING} submissions: try again later"
            raise ProblemError(503, "busy", why, headers={"Retry-After": "5"})

    def claim(self, replica: str, timeout_s: float) -> str | None:
        """The next queued element, now ``replica``'s (``None`` after ``timeout_s``)."""
        element = self.redis.blmove(PENDING, _claimed(replica), timeout_s, "LEFT", "RIGHT")  # type: ignore[arg-type]
        return None if element is None else str(element)

    def release(self, replica: str, element: str) -> None:
        self.redis.lrem(_claimed(replica), 1, element)

    def start(self, token: str) -> Started | None:
        """Mark ``token`` as being judged (one more attempt); ``None`` when it is gone."""
        found = self._start(keys=[_sub(token)])
        if not found:
            return None
        attempts, doc, files = found
        return Started(token, json.loads(doc), json.loads(files) if files else {}, int(attempts))

    def finish(self, token: str, record: BatchRecord) -> bool:
        """Record ``token``'s result (its files are dropped); ``False`` when it is gone."""
        done = self._finish(keys=[_sub(token)], args=[record.model_dump_json(), now()])
        return bool(done)

    def load(self, token: str) -> Entry | None:
        """Submission ``token``, whoever's it is (``None``: there is none)."""
        fields = ["owner", "doc", "status_id", "result", "finished_at"]
        owner, doc, status, result, finished_at = self.redis.hmget(_sub(token), fields)
        if owner is None or doc is None:
            return None
        return Entry(
            owner=str(owner),
            doc=json.loads(doc),
            status_id=int(status or 1),
            result=BatchRecord.model_validate_json(result) if result else None,
            finished_at=None if finished_at is None else str(finished_at),
        )

    def get(self, owner: str, token: str) -> Entry:
        """``owner``'s submission ``token``, else not found (another token's too)."""
        entry = self.load(token)
        if entry is None or entry.owner != owner:
            raise ProblemError(404, "not_found", f"no submission {token}")
        return entry

    def delete(self, owner: str, token: str) -> Entry:
        """Forget a finished submission of ``owner``'s and give it back; one still queued or
        running is refused (as Judge0 does: its result has nowhere to go yet)."""
        entry = self.get(owner, token)
        if entry.result is None:
            raise ProblemError(
                400, "input", f"submission {token} is still queued or running: not deleted"
            )
        self.redis.delete(_sub(token))
        return entry

    def heartbeat(self, replica: str) -> None:
        with self.redis.pipeline() as pipe:
            pipe.set(_alive(replica), "1", px=int(ALIVE_S * 1000))
            pipe.sadd(REPLICAS, replica)
            pipe.execute()

    def requeue_dead(self, replica: str) -> int:
        """Queue again, first in line, what servers without a heartbeat had claimed (each
        element moves once, whoever else does this at the same time); how many moved."""
        moved = 0
        for other in sorted(str(r) for r in self.redis.smembers(REPLICAS)):
            if other == replica or self.redis.exists(_alive(other)):
                continue
            moved += self._requeue(other)
            self.redis.srem(REPLICAS, other)
        return moved

    def retire(self, replica: str) -> int:
        """``replica`` stops: its claims go back to the queue now, not after ``ALIVE_S``."""
        moved = self._requeue(replica)
        with self.redis.pipeline() as pipe:
            pipe.delete(_alive(replica))
            pipe.srem(REPLICAS, replica)
            pipe.execute()
        return moved

    def _requeue(self, replica: str) -> int:
        moved = 0
        while self.redis.lmove(_claimed(replica), PENDING, "RIGHT", "LEFT") is not None:
            moved += 1
        return moved
