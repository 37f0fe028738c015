"""A session call's end in Redis (``farm.events.exec_finish``): journal, record and session entry in
one script, on a real redis-server; the claim still refuses a second run of a finished call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from farm.events.journal import INDEX, Journal, journal_key
from farm.events.run_events import ExecEnd, ExecStart, parse_event
from farm.registry import BROKER_MARK, Registry
from farm.settings import FarmSettings


@pytest.fixture
def registry(redis_server: Any) -> Iterator[Registry]:
    registry = Registry(redis_server.url)
    yield registry
    registry.close()


def events(exec_id: str, session_id: str) -> list[Any]:
    common = {"exec_id": exec_id, "session_id": session_id, "ts": 1.0}
    return [
        ExecStart(**common, seq=0, code="x+1", epoch=1),
        ExecEnd(**common, seq=1, status="ok", epoch=1),
    ]


def test_a_finished_call_has_its_journal_record_and_session_and_is_never_claimed_again(
    registry: Registry,
) -> None:
    journal = Journal(registry.redis, FarmSettings())
    done = events("e-finish-1", "s-finish-1")
    rows = [event.model_dump_json() for event in done]
    assert registry.claim_exec("e-finish-1", "w1", 3, timeout_s=5) is None
    entries = journal.entries("s-finish-1", "e-finish-1", rows, rows)
    fields = {"worker": "w1", "generation": 3, "queue": "q", "image": "default", "epoch": 1}
    error = registry.finish_exec(
        "e-finish-1", {"status": "ok"}, session=("s-finish-1", fields, 60.0), events=entries
    )
    assert error == ""
    assert registry.exec_record("e-finish-1") == {"state": "done", "result": {"status": "ok"}}
    assert [type(e) for e in journal.events("s-finish-1")] == [ExecStart, ExecEnd]
    live = registry.redis.xrange("farm:events:e-finish-1")
    assert [parse_event(fields["e"]).seq for _, fields in live] == [0, 1]
    assert registry.redis.pttl(journal_key("s-finish-1")) > 0
    assert registry.redis.zscore(INDEX, "s-finish-1") is not None
    session = registry.session("s-finish-1")
    assert session is not None and session["generation"] == 3 and session["worker"] == "w1"
    assert 0 < registry.redis.pttl("farm:session:s-finish-1") <= 60_000
    # a redelivered or duplicated message finds the result, and does not run again
    assert registry.claim_exec("e-finish-1", "w2", 4) == {
        "state": "done",
        "result": {"status": "ok"},
    }


def test_a_journal_that_cannot_be_written_still_lets_the_record_through(
    registry: Registry,
) -> None:
    journal = Journal(registry.redis, FarmSettings())
    registry.redis.set(journal_key("s-finish-2"), "not a stream")  # XADD fails: WRONGTYPE
    rows = [event.model_dump_json() for event in events("e-finish-2", "s-finish-2")]
    assert registry.claim_exec("e-finish-2", "w1", 1) is None
    error = registry.finish_exec(
        "e-finish-2",
        {"status": "ok"},
        events=journal.entries("s-finish-2", "e-finish-2", rows, None),
    )
    assert "WRONGTYPE" in error
    assert registry.exec_record("e-finish-2") == {"state": "done", "result": {"status": "ok"}}
    assert registry.session("s-finish-2") is None  # no session given: none written
    assert registry.claim_exec("e-finish-2", "w1", 1) is not None


def test_the_broker_mark_is_made_once_when_missing_and_then_read(registry: Registry) -> None:
    registry.redis.delete(BROKER_MARK)  # a data set that was lost: the next reader makes one
    made = registry.broker_mark()
    assert made and registry.redis.get(BROKER_MARK) == made
    assert registry.broker_mark() == made
    why, mark = registry.session_state("no-such-session", "no-such-worker", 1)
    assert mark == made and why is not None and "is gone" in why
    registry.redis.delete(BROKER_MARK)
    _, remade = registry.session_state("no-such-session", "no-such-worker", 1)
    assert remade != made and registry.broker_mark() == remade
