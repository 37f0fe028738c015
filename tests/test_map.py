"""``Farm.map`` against a real Redis and a real Celery worker in this process (process backend):
records, order, laziness, cancellation, retries and the async twin. The Docker end-to-end
cases (isolation per item, a worker killed mid-chunk) are in ``test_cotenancy.py`` and
``test_reliability_chaos.py``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from farm.client import AsyncFarm, Farm
from farm.client.mapping import MAX_CHUNK
from farm.models.batch import BatchItem
from farm.registry import ITEM_CLAIM_S, PREFIX, Registry, results_key
from tests.waiting import stays, wait_for


def test_every_item_gets_one_record_in_the_items_order(inproc_farm: Farm) -> None:
    items: list[Any] = [f"{i} * 3" for i in range(60)]
    items.insert(7, {"id": "no-body"})  # malformed: a record of kind input, in its place
    items.append(
        {
            "id": "cells",
            "cells": ["x = int(open('n.txt').read())", "x + 1"],
            "files": {"n.txt": "41"},
            "setup": "import os",
        }
    )
    items.append(BatchItem(id="raises", code="1 / 0"))
    records = list(inproc_farm.map(items))
    # a code string's id is its place in the items
    assert [r.id for r in records] == [*range(7), "no-body", *range(8, 61), "cells", "raises"]
    assert records[7].kind == "input" and "code" in (records[7].message or "")
    assert all(r.ok and r.cells[0].value is not None for r in records[:7])
    assert records[12].cells[0].value.text == str(11 * 3)  # type: ignore[union-attr]
    cells = records[-2]
    assert cells.ok and len(cells.cells) == 3 and cells.cells[-1].value.text == "42"  # type: ignore[union-attr]
    assert (records[-1].status, records[-1].kind, records[-1].attempts) == ("error", "user", 1)
    assert records[0].manifest["worker"] and records[0].manifest["image"] == "default"


def test_an_item_whose_text_is_not_utf8_gets_its_own_record_and_its_chunk_runs(
    inproc_farm: Farm,
) -> None:
    # json.loads("\"\\ud800\"") is a lone surrogate, which no UTF-8 message can carry.
    lone = json.loads('"x = \\ud800"')
    items: list[Any] = ["1 + 1", {"id": "lone", "code": lone}, "2 + 2"]
    records = {r.id: r for r in inproc_farm.map(items)}
    assert records["lone"].kind == "input" and "UTF-8" in (records["lone"].message or "")
    assert records[0].ok and records[2].ok, records


def test_unordered_records_come_as_items_finish(inproc_farm: Farm) -> None:
    items = ["import time; time.sleep(1.5); 'slow'", *[f"{i}" for i in range(10)]]
    first = next(iter(inproc_farm.map(items, ordered=False)))
    assert first.id != 0


def assert_only_the_running_items_end(redis: Any, key: str) -> None:
    """After a cancel, a map's result list grows by what was in flight (at most the window of
    8), then stays as it is: the rest never runs."""
    seen = [redis.llen(key)]

    def unchanged() -> bool:
        now = redis.llen(key)
        same, seen[0] = now == seen[0], now
        return same

    assert wait_for(lambda: stays(unchanged, 0.5), 15)  # the items running at the cancel end
    assert seen[0] <= 8  # at most those in flight ran after the cancel; the rest never will
    assert stays(unchanged, 1.0)


def test_items_are_read_lazily_and_leaving_early_cancels_the_rest(inproc_farm: Farm) -> None:
    read = itertools.count()

    def million() -> Iterator[str]:
        for i in range(1_000_000):
            next(read)
            yield f"import time; time.sleep(0.05); {i}"

    run = inproc_farm.map(million(), concurrency=8)
    taken = list(itertools.islice(run, 20))
    assert [r.id for r in taken] == list(range(20))
    run.close()
    consumed = next(read)
    assert consumed <= 20 + 8 + MAX_CHUNK  # only the window was ever read
    assert_only_the_running_items_end(inproc_farm.registry.redis, results_key(run.map_id))


def test_leaving_an_async_map_early_cancels_the_rest(inproc_farm: Farm) -> None:
    """``break`` out of ``async for`` over ``AsyncFarm.map``: as with ``Farm.map``, only the
    window was ever read, the map is cancelled without an explicit close (the generator's
    cleanup runs on the loop once the loop is left), and the items running then end."""
    read = itertools.count()

    def million() -> Iterator[str]:
        for i in range(1_000_000):
            next(read)
            yield f"import time; time.sleep(0.05); {i}"

    redis = inproc_farm.registry.redis
    cancels = f"{PREFIX}map:*:cancel"
    before = set(redis.scan_iter(cancels))

    def cancelled() -> list[str]:
        return [str(key) for key in redis.scan_iter(cancels) if key not in before]

    async def take_twenty() -> tuple[list[Any], list[str]]:
        taken = []
        async for record in AsyncFarm(inproc_farm).map(million(), concurrency=8):
            taken.append(record)
            if len(taken) == 20:
                break
        # the loop runs on: the map must be cancelled now, not when the loop ends
        return taken, await asyncio.to_thread(wait_for, cancelled, 10)

    taken, keys = asyncio.run(take_twenty())
    assert [r.id for r in taken] == list(range(20))
    assert len(keys) == 1, "leaving the async for did not cancel the map"
    consumed = next(read)
    assert consumed <= 20 + 8 + MAX_CHUNK  # only the window was ever read
    map_id = keys[0].removeprefix(f"{PREFIX}map:").removesuffix(":cancel")
    assert_only_the_running_items_end(redis, results_key(map_id))
    assert next(read) == consumed + 1  # nothing more was read meanwhile


def test_cancelling_the_task_that_reads_an_async_map_cancels_the_map_and_frees_its_thread(
    inproc_farm: Farm,
) -> None:
    """A task awaiting its next record is cancelled (a timeout around it, a shutdown): the
    map is cancelled and the thread that waited for records returns, so ``asyncio.run``
    ends (it waits for that thread); before, the thread waited for ever for results that a
    cancelled map's items never publish."""
    redis = inproc_farm.registry.redis
    cancels, claims = f"{PREFIX}map:*:cancel", f"{PREFIX}exec:*"
    before, claimed = set(redis.scan_iter(cancels)), set(redis.scan_iter(claims))

    async def read_until_cancelled() -> None:
        async def read() -> None:
            async for _ in AsyncFarm(inproc_farm).map(["import time; time.sleep(60)"] * 4):
                pass

        task = asyncio.create_task(read())
        running = await asyncio.to_thread(  # its chunk and an item claimed: items run
            wait_for, lambda: len(set(redis.scan_iter(claims)) - claimed) >= 2, 10
        )
        assert running, "the map's items never started"
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    finished = threading.Event()

    def run() -> None:
        asyncio.run(read_until_cancelled())
        finished.set()

    threading.Thread(target=run, daemon=True).start()
    assert finished.wait(30), "asyncio.run never returned: a thread still waits for records"
    assert wait_for(lambda: set(redis.scan_iter(cancels)) - before, 10), "not cancelled"


def test_a_map_whose_items_name_another_image_needs_no_worker_of_the_default() -> None:
    """Items that all name ``"image": "ds"`` run on a fleet that has only ``ds`` workers (the
    map's own image is checked only for items that run on it: their records say it is not
    served). The client is a fleet's: it starts no workers."""
    from farm.local.embedded import LocalFarm

    local = LocalFarm({"ds": 1}, backend="process").start()
    try:
        with Farm(local.settings()) as farm:
            items = [{"id": i, "code": f"{i} * 2", "image": "ds"} for i in range(5)]
            records = list(farm.map(items))
            assert [(r.status, r.manifest["image"]) for r in records] == [("ok", "ds")] * 5
            assert [r.cells[0].value.text for r in records] == ["0", "2", "4", "6", "8"]  # type: ignore[union-attr]
            mixed = list(farm.map([{"id": "here", "code": "1", "image": "ds"}, "2"]))
            assert [(r.id, r.status, r.kind) for r in mixed] == [
                ("here", "ok", None),
                (1, "error", "infra"),
            ]
            assert "no live worker serves image 'default'" in (mixed[1].message or "")
    finally:
        local.close()


def test_a_local_farm_starts_workers_only_for_the_images_items_name() -> None:
    with Farm.local(images={"ds": 1}, backend="process") as farm:
        items = [{"id": i, "code": f"{i}", "image": "ds"} for i in range(3)]
        assert [r.ok for r in farm.map(items)] == [True] * 3
        assert {w["image"] for w in farm.workers()} == {"ds"}
        assert set(farm.local_farm.worker_images.values()) == {"ds"}


def test_only_infrastructure_failures_are_retried(inproc_farm: Farm) -> None:
    records = list(
        inproc_farm.map(
            ["raise ValueError('user')", "import time; time.sleep(5)", "bytearray(2**40)"],
            timeout_s=0.5,
            retries=2,
        )
    )
    assert [(r.kind, r.attempts) for r in records] == [("user", 1), ("timeout", 1), ("oom", 1)]


def test_item_limits_reach_the_items_box(inproc_farm: Farm) -> None:
    code = "import resource\nresource.getrlimit(resource.RLIMIT_NOFILE)[0]"
    (small, default) = inproc_farm.map(
        [{"id": "small", "code": code, "limits": {"nofile": 64}}, {"id": "default", "code": code}]
    )
    assert small.cells[0].value is not None and small.cells[0].value.text == "64"
    assert default.cells[0].value is not None and default.cells[0].value.text == "512"


def test_the_async_twin_yields_the_same_records(inproc_farm: Farm) -> None:
    async def collect() -> list[Any]:
        farm = AsyncFarm(inproc_farm)
        return [record async for record in farm.map([f"{i} + 1" for i in range(20)])]

    records = asyncio.run(collect())
    assert [r.cells[0].value.text for r in records] == [str(i + 1) for i in range(20)]


def test_an_items_claim_is_kept_minutes_not_an_hour(inproc_farm: Farm) -> None:
    """A map item's claim only has to outlive its run and its map's resends: kept for an hour,
    a busy farm's Redis would hold one for each of the last hour's items."""
    (record,) = inproc_farm.map(["6 * 7"], timeout_s=5)
    exec_id = record.cells[0].exec_id.rsplit("-", 1)[0]  # the item's: its cells' ids end -<n>
    ttl = inproc_farm.registry.redis.ttl(f"{PREFIX}exec:{exec_id}")
    assert ITEM_CLAIM_S - 60 < ttl <= ITEM_CLAIM_S + 5, ttl


def test_the_first_record_does_not_wait_for_the_map_to_be_sent(inproc_farm: Farm) -> None:
    """Chunks start at one item: the first record comes while most items are still unread
    (the map reads its window of ``concurrency`` items and the next chunk's, no more)."""
    read = itertools.count()

    def items() -> Iterator[str]:
        for i in range(2000):
            next(read)
            yield f"{i}"

    run = inproc_farm.map(items())
    first = next(iter(run))
    assert first.id == 0 and next(read) <= run.concurrency + MAX_CHUNK < 1000
    run.close()


def test_results_are_popped_on_a_server_without_blmpop(tmp_path: Path) -> None:
    """Redis < 7 has no BLMPOP: the registry falls back to BLPOP and LPOP (a real server whose
    BLMPOP is renamed away answers exactly as an older one does: unknown command)."""
    from farm.local.redis_server import RedisServer

    server = RedisServer(tmp_path, extra_config=['rename-command BLMPOP ""']).start()
    registry = Registry(server.url)
    try:
        registry.redis.rpush("farm:map:m:results", "a", "b", "c")
        assert registry.pop_results("farm:map:m:results", 0.1, 2) == ["a", "b"]
        assert not registry._blmpop
        assert registry.pop_results("farm:map:m:results", 0.1, 2) == ["c"]
        assert registry.pop_results("farm:map:m:results", 0.1, 2) == []
    finally:
        registry.close()
        server.stop()


def test_results_are_popped_in_one_command_on_redis_7(redis_server: Any) -> None:
    registry = Registry(redis_server.url)
    try:
        registry.redis.rpush("farm:map:n:results", "a", "b", "c")
        before = registry.redis.info("commandstats").get("cmdstat_blmpop", {}).get("calls", 0)
        assert registry.pop_results("farm:map:n:results", 0.1, 2) == ["a", "b"]
        assert registry.pop_results("farm:map:n:results", 0.1, 2) == ["c"]
        after = registry.redis.info("commandstats")["cmdstat_blmpop"]["calls"]
        assert (after - before, registry._blmpop) == (2, True)
    finally:
        registry.redis.delete("farm:map:n:results")
        registry.close()
