"""The chaos tests' own instruments, on real Redis and Celery messages: a checker that
reads nothing would make their "nothing stale ran" checks pass unseen (not a chaos test
itself, so it runs with the fast suite)."""

from __future__ import annotations

from typing import Any

import pytest

from farm.celeryconf import TASK_EXEC
from farm.client import Farm
from farm.image_name import ImageName
from farm.models.batch import BatchItem, Chunk
from farm.registry import chunks_key
from tests.conftest import farm_worker, inproc_worker
from tests.test_reliability_chaos import (
    SentChunks,
    Waiting,
    runs_problems,
    sweep_items,
    waiting_messages,
)


def test_waiting_messages_reads_what_the_client_sends(redis_server: Any) -> None:
    """``waiting_messages`` on real messages: a map's chunks in their list, and a session
    call in a direct queue, then the same call taken by a consumer that has not acked it
    (what the kill -9 case reads at the kill)."""
    with farm_worker(redis_server.url) as worker, Farm(worker.settings) as farm:
        redis = farm.registry.redis
        chunks, direct = chunks_key(ImageName("default").queue), worker.queues[-1]
        run = farm.map([{"id": "a", "code": "1"}, {"id": "b", "cells": ["x = 1", "x"]}])
        sent: tuple[str, ...] = ()
        try:
            run._fill()  # the map's own send path: its first chunks, to the list of chunks
            sent = tuple(attempt.exec_id for attempt in run._pending.values())
            farm.broker.send(TASK_EXEC, direct, args=[{"exec_id": "call-1", "code": "1"}])
            found = waiting_messages(redis, [direct], chunks)
            waiting = [w for w in found if w.chunk_id and set(w.exec_ids) <= set(sent)]
            assert sorted(e for w in waiting for e in w.exec_ids) == sorted(sent), found
            assert {(w.queue, w.taken) for w in waiting} == {(chunks, False)}, found
            assert Waiting(direct, ("call-1",)) in found, found
            with farm.app.connection_for_read() as conn:
                consumer = conn.SimpleQueue(direct)
                try:  # take the call without acking it
                    consumer.get(timeout=5)
                    held = waiting_messages(redis, [direct], chunks)
                    assert Waiting(direct, ("call-1",), taken=True) in held, held
                    assert Waiting(direct, ("call-1",)) not in held, held
                finally:
                    consumer.close()  # kombu puts what it held back in the queue
        finally:
            run.close()
            for raw in redis.lrange(chunks, 0, -1):  # this test's chunks only
                if {i.exec_id for i in Chunk.model_validate_json(raw).items} <= set(sent):
                    redis.lrem(chunks, 0, raw)
            redis.delete(direct)


def test_runs_problems_sees_an_item_that_ran_twice(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runs_problems`` finds nothing wrong in a clean map, and finds an item whose second
    attempt was claimed by a live worker (the claim a double run would leave)."""
    with inproc_worker(redis_server.url) as (farm, worker):
        sent = SentChunks(farm, monkeypatch)
        items = sweep_items(6)
        records = [r.model_dump(mode="json") for r in farm.map(items)]
        assert [r["status"] for r in records] == ["ok"] * 6, records
        live = (worker.id, worker.generation)
        assert runs_problems(farm, sent, items, records, dead=("killed", 1)) == []
        again = "a-second-attempt"
        farm.registry.claim_exec(again, *live)
        sent.exec_ids[tuple(BatchItem.model_validate(items[0]).all_cells())].add(again)
        found = runs_problems(farm, sent, items, records, dead=("killed", 1))
        assert [p.split(": ", 1)[1] for p in found] == ["ran twice", "1 attempts recorded"]
        # the same claim by the killed generation is an attempt it lost, not a second run
        found = runs_problems(farm, sent, items, records, dead=live)
        assert [p.split(": ", 1)[1] for p in found] == ["1 attempts recorded"], found
