"""``Farm.map`` when a part fails under it, against a real Redis and a real Celery worker in
this process (process backend). Apart from ``test_map.py`` because each case owns its Redis and
its worker: two Celery workers running at once in one process share Celery's process-wide
worker state. The Docker case of a worker killed mid-chunk is in ``test_reliability_chaos.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from farm.client import Farm
from farm.client.mapping import TAKEN_WAIT_S
from farm.image_name import ImageName
from farm.local.redis_server import RedisServer
from farm.models.batch import Chunk
from farm.registry import chunks_key, taken_key
from tests.conftest import consuming, farm_worker
from tests.waiting import stays, wait_for


@pytest.mark.slow
def test_a_chunk_a_dying_consumer_took_is_sent_again_within_seconds(tmp_path: Any) -> None:
    """A chunk taken off its list by a worker that died before claiming it leaves no trace but
    its turn gone by: the map abandons that chunk (a late copy runs nothing) and sends its
    items again ``TAKEN_WAIT_S`` after its turn came, not at some far deadline."""
    server = RedisServer(tmp_path).start()
    try:
        with farm_worker(server.url) as worker, Farm(worker.settings) as farm:
            outcome: dict[str, Any] = {}
            started = time.monotonic()
            mapping = threading.Thread(
                target=lambda: outcome.update(records=list(farm.map(["1 + 1", "2 + 2", "3 + 3"])))
            )
            mapping.start()
            # the first chunk, taken by a consumer that dies with it (nothing consumes yet)
            key = chunks_key(ImageName("default").queue)
            raw = wait_for(lambda: farm.registry.redis.rpop(key), 10)
            assert raw, "the map sent nothing"
            farm.registry.redis.incr(taken_key(key))  # as a worker counts what it takes
            stolen = Chunk.model_validate_json(raw)
            with consuming(worker):
                mapping.join(60)
            took = time.monotonic() - started
            records = outcome["records"]
            assert [(r.id, r.cells[-1].value.text) for r in records] == [  # type: ignore[union-attr]
                (0, "2"),
                (1, "4"),
                (2, "6"),
            ]
            assert all(r.attempts == 1 for r in records)  # resent, not retried
            assert farm.registry.exec_record(stolen.chunk_id) == {"state": "abandoned"}
            assert took < 4 * TAKEN_WAIT_S, f"noticed only after {took:.1f}s"
    finally:
        server.stop()


@pytest.mark.slow
def test_a_chunk_waiting_for_its_turn_is_never_sent_again(tmp_path: Any) -> None:
    """A farm with no room keeps a map's chunks in its list, however long: the map waits for
    them (no chunk abandoned, none sent twice), and they run once a worker takes them."""
    server = RedisServer(tmp_path).start()
    try:
        with farm_worker(server.url) as worker, Farm(worker.settings) as farm:
            outcome: dict[str, Any] = {}
            mapping = threading.Thread(
                target=lambda: outcome.update(records=list(farm.map(["1 + 1", "2 + 2", "3 + 3"])))
            )
            mapping.start()
            key = chunks_key(ImageName("default").queue)
            assert wait_for(lambda: farm.registry.redis.llen(key) == 2, 10), "not queued"
            queued = farm.registry.redis.lrange(key, 0, -1)
            # the map checks its chunks every CHECK_EVERY_S: several checks pass meanwhile
            assert stays(lambda: farm.registry.redis.lrange(key, 0, -1) == queued, 3 * TAKEN_WAIT_S)
            with consuming(worker):
                mapping.join(60)
            records = outcome["records"]
            assert [r.cells[-1].value.text for r in records] == ["2", "4", "6"]  # type: ignore[union-attr]
            assert all(r.ok and r.attempts == 1 for r in records)
            for raw in queued:
                claim = farm.registry.exec_record(Chunk.model_validate_json(raw).chunk_id)
                assert claim is not None and claim["state"] == "running", claim
    finally:
        server.stop()


def test_cancelling_items_that_already_ended_keeps_the_kernel_connection(tmp_path: Any) -> None:
    """A cancelled map's running items get their boxes closed; an item that ended meanwhile
    (the kernel has no such session) is no broken connection: the worker keeps its one kernel
    client, and no dropped client is reconnected and left open (a leaked socket)."""
    server = RedisServer(tmp_path).start()
    try:
        with farm_worker(server.url) as worker:
            with worker.kernel() as client:
                pass
            worker.batch._open["a-map"] = {"ended-1", "ended-2", "ended-3"}
            worker.batch._cancel("a-map", {})
            with worker.kernel() as again:
                assert again is client
            assert worker._clients == {client}
    finally:
        server.stop()


def test_a_lent_kernel_client_is_dropped_on_a_failure_and_kept_on_a_refusal(
    tmp_path: Any,
) -> None:
    """``Worker.kernel()`` lends the thread's client: a refusal leaves it in place, a broken
    connection drops it (closed, forgotten), and the next loan connects a new one."""
    from farm.kernel.wire.client import KernelConnectionError, KernelRequestError

    server = RedisServer(tmp_path).start()
    try:
        with farm_worker(server.url) as worker:
            with pytest.raises(KernelRequestError), worker.kernel() as client:
                client.close_session("no-such-session")
            with pytest.raises(KernelConnectionError), worker.kernel() as same:
                assert same is client
                raise KernelConnectionError("the connection broke")
            assert worker._clients == set()
            with worker.kernel() as fresh:
                assert fresh is not client
                assert fresh.ping()["type"] == "pong"
            assert worker._clients == {fresh}
    finally:
        server.stop()


def test_a_cancelled_map_takes_its_waiting_chunks_out_of_the_list(tmp_path: Any) -> None:
    """Chunks no worker took yet leave the list when their map is left: the backlog (what an
    autoscaler reads) is work someone still wants, and no worker pops them for nothing."""
    server = RedisServer(tmp_path).start()
    try:
        with farm_worker(server.url) as worker, Farm(worker.settings) as farm:
            key = chunks_key(ImageName("default").queue)
            other = '{"a chunk": "of another map"}'
            farm.registry.redis.lpush(key, other)
            run = farm.map([f"{n}" for n in range(20)])
            run._fill()  # queues its first chunks; no worker takes them (none consumes)
            assert farm.registry.redis.llen(key) > 2
            run.close()
            assert farm.registry.redis.lrange(key, 0, -1) == [other]
    finally:
        server.stop()
