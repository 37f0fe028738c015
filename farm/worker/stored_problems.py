"""A worker's stored problems: each read from Redis once, on its first item, then kept in a
bounded LRU keyed by digest (a digest names one content: an entry is never stale).

Invariants: at most ``CACHE_BYTES`` of problems (their canonical size) are kept; a problem in
use has its TTL in Redis pushed back at most every ``REFRESH_S``, so one judged from the LRU
alone is not forgotten by the store; a missing problem is ``ProblemNotFound`` (the item's
``input`` error), never retried as infra.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from farm.broker_errors import BROKER_DOWN
from farm.judge import problems
from farm.judge.problems import Problem

if TYPE_CHECKING:
    import redis

CACHE_BYTES = 256 << 20


class StoredProblems:
    """Problems by digest: the LRU, else Redis."""

    def __init__(self, client: redis.Redis, limit: int = CACHE_BYTES) -> None:
        self.client = client
        self.limit = limit
        self.entries: OrderedDict[str, tuple[int, Problem, float]] = OrderedDict()
        self.size = 0
        self.fetches = 0  # reads from Redis (misses)
        self.lock = threading.Lock()

    def get(self, digest: str) -> Problem:
        now = time.monotonic()
        with self.lock:
            entry = self.entries.get(digest)
            if entry is not None:
                self.entries.move_to_end(digest)
                size, problem, refreshed = entry
                if now - refreshed < problems.REFRESH_S:
                    return problem
                self.entries[digest] = (size, problem, now)
        if entry is not None:
            # In use: the store keeps it for the workers that have not read it (an outage:
            # the next use tries again).
            with contextlib.suppress(*BROKER_DOWN):
                self.client.expire(problems.key(digest), problems.TTL_S)
            return entry[1]
        problem = problems.fetch(self.client, digest)  # ProblemNotFound when it is not there
        self.fetches += 1
        size = len(problem.canonical)
        with self.lock:
            if digest not in self.entries and size <= self.limit:
                self.entries[digest] = (size, problem, now)
                self.size += size
                while self.size > self.limit:
                    _, (old, _, _) = self.entries.popitem(last=False)
                    self.size -= old
        return problem
