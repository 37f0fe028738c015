"""Where events live in Redis: a stream per streamed run, and a journal per session.

``farm:journal:<session>`` holds every event of a session's runs, bounded and expiring, so any
process can replay it; ``farm:events:<exec>`` one streamed run's events; ``farm:journals`` the
sessions by last event, for a UI. Invariant: writers never fail a run (the journal records
what happened; it is not part of running it). Keys and bounds: docs/design/events-and-journal.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from farm.events.run_events import Event, parse_event
from farm.models import CallAnswer
from farm.settings import FarmSettings

PREFIX = "farm:"
INDEX = f"{PREFIX}journals"
INDEX_MAX = 1000
PAGE = 500


def journal_key(session_id: str) -> str:
    return f"{PREFIX}journal:{session_id}"


def exec_key(exec_id: str) -> str:
    return f"{PREFIX}events:{exec_id}"


ANSWER_TTL_S = 120  # an answer nobody took (its cell ended first) does not linger


def answer_key(exec_id: str, call_id: int) -> str:
    """The list where the client pushes its answer to one host call of a run."""
    return f"{PREFIX}answer:{exec_id}:{call_id}"


@dataclass(frozen=True)
class Entries:
    """Events of one run as JSON, ready to add: to each stream (key, bound, TTL in ms, its
    entries), and the session to the index at ``at``. Written by ``Journal.add``, or by the
    worker's script that also records the run's end (``Registry.finish_exec``)."""

    streams: tuple[tuple[str, int, int, tuple[str, ...]], ...]
    session_id: str
    at: float
    index: str = INDEX
    index_max: int = INDEX_MAX


class Journal:
    def __init__(self, client: redis.Redis, settings: FarmSettings) -> None:
        self.redis = client  # decode_responses=True (the registry's client)
        self.max_events = settings.journal_max_events
        self.ttl_ms = int(settings.journal_ttl_s * 1000)
        self.exec_max = settings.event_stream_max_events
        self.exec_ttl_ms = int(settings.event_stream_ttl_s * 1000)
        self.exec_max_bytes = settings.journal_exec_max_bytes

    # --- writing (workers) ----------------------------------------------------------------

    def append(self, journaled: list[Event], live: list[Event] | None = None) -> None:
        """Add a run's events to its session's journal and, when the caller streams it, the
        ``live`` ones (the same events, outputs in full) to the run's own stream."""
        if not journaled:
            return
        first = journaled[0]
        self.add(
            self.entries(
                first.session_id,
                first.exec_id,
                [event.model_dump_json() for event in journaled],
                [event.model_dump_json() for event in live] if live else None,
            )
        )

    def entries(
        self, session_id: str, exec_id: str, journaled: list[str], live: list[str] | None
    ) -> Entries:
        """``Entries`` of a run's events already as JSON (see ``append``)."""
        streams = [(journal_key(session_id), self.max_events, self.ttl_ms, tuple(journaled))]
        if live:
            streams.append((exec_key(exec_id), self.exec_max, self.exec_ttl_ms, tuple(live)))
        return Entries(tuple(streams), session_id, time.time())

    def add(self, entries: Entries) -> None:
        """Write ``entries`` in one round trip."""
        with self.redis.pipeline(transaction=False) as pipe:
            for key, maxlen, _, rows in entries.streams:
                for row in rows:
                    entry: dict[Any, Any] = {"e": row}
                    pipe.xadd(key, entry, maxlen=maxlen, approximate=True)
            for key, _, ttl_ms, _ in entries.streams:
                pipe.pexpire(key, ttl_ms)
            pipe.zadd(entries.index, {entries.session_id: entries.at})
            pipe.zremrangebyrank(entries.index, 0, -entries.index_max - 1)
            pipe.execute()

    # --- reading --------------------------------------------------------------------------

    def read_exec(self, exec_id: str, after: str, block_ms: int) -> tuple[str, list[Event]]:
        """Events of a streamed run after stream id ``after``, waiting up to ``block_ms``."""
        reply = self.redis.xread({exec_key(exec_id): after}, count=PAGE, block=block_ms)
        return _entries(reply, after)

    def push_answer(self, exec_id: str, call_id: int, answer: CallAnswer) -> None:
        """The client's answer to a host call; the worker waits on this list for it."""
        key = answer_key(exec_id, call_id)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.rpush(key, answer.model_dump_json())
            pipe.expire(key, ANSWER_TTL_S)
            pipe.execute()

    def drop_exec(self, exec_id: str) -> None:
        self.redis.delete(exec_key(exec_id))

    def follow(self, session_id: str, after: str, block_ms: int) -> tuple[str, list[Event]]:
        """Journal events after ``after`` (``"0"``: from the start), waiting up to ``block_ms``."""
        reply = self.redis.xread({journal_key(session_id): after}, count=PAGE, block=block_ms)
        return _entries(reply, after)

    def follow_ids(
        self, session_id: str, after: str, block_ms: int
    ) -> tuple[str, list[tuple[str, Event]]]:
        """Like ``follow``, with each event's stream id (a reader's resume point)."""
        reply: Any = self.redis.xread({journal_key(session_id): after}, count=PAGE, block=block_ms)
        out: list[tuple[str, Event]] = []
        for _key, rows in reply or []:
            for entry_id, fields in rows:
                after = entry_id
                out.append((entry_id, parse_event(fields["e"])))
        return after, out

    def events(self, session_id: str) -> Iterator[Event]:
        """Every event the journal still holds, oldest first (read page by page)."""
        after = "-"
        while True:
            rows: Any = self.redis.xrange(journal_key(session_id), min=after, count=PAGE)
            for entry_id, fields in rows:
                if entry_id != after:
                    yield parse_event(fields["e"])
            if len(rows) < PAGE:
                return
            after = rows[-1][0]

    def complete(self, session_id: str) -> bool:
        """True when the journal still holds every event ever added (none trimmed or expired)."""
        try:
            info = self.redis.xinfo_stream(journal_key(session_id))
        except redis.ResponseError:  # no such key: expired, or never written
            return False
        added = info.get("entries-added")
        return added is None or int(added) == int(info["length"])

    def sessions(self, limit: int = 200) -> list[tuple[str, float]]:
        """Session ids with a journal, most recently active first."""
        rows: Any = self.redis.zrevrange(INDEX, 0, limit - 1, withscores=True)
        return [(str(member), float(score)) for member, score in rows]


def _entries(reply: Any, after: str) -> tuple[str, list[Event]]:
    events: list[Event] = []
    for _key, rows in reply or []:
        for entry_id, fields in rows:
            after = entry_id
            events.append(parse_event(fields["e"]))
    return after, events
