"""Session opens wait in Redis until a worker has room (``farm.client.opening``,
``farm.worker.opens``), against a real Redis and a real Celery worker in this process
(process backend): an open waits there, not on a worker; one its client gave up at its
deadline is taken back, and a worker that takes it later opens nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from farm.client import Farm
from farm.errors import FarmBusy
from farm.image_name import ImageName
from farm.local.redis_server import RedisServer
from farm.models import OpenRequest
from farm.registry import answers_key, opens_key
from tests.conftest import consuming, farm_worker
from tests.waiting import stays, wait_for

KEY = opens_key(ImageName("default").queue)


def test_an_open_waits_in_redis_until_a_worker_takes_it(tmp_path: Any) -> None:
    server = RedisServer(tmp_path).start()
    try:
        with farm_worker(server.url) as worker, Farm(worker.settings) as farm:
            opened: list[Any] = []
            thread = threading.Thread(target=lambda: opened.append(farm.session()))
            thread.start()
            assert wait_for(lambda: farm.registry.redis.llen(KEY) == 1, 10), "not queued"
            assert stays(lambda: not opened, 1.0)  # no worker takes opens yet: it waits
            with consuming(worker):
                thread.join(30)
                (session,) = opened
                assert session.run("6 * 7").value.text == "42"  # type: ignore[union-attr]
                assert session.queue_s >= 1.0, session.queue_s  # its time in the list
                session.close()
            assert farm.registry.redis.llen(KEY) == 0
    finally:
        server.stop()


def test_an_open_given_up_at_its_deadline_is_taken_back_and_never_opens(tmp_path: Any) -> None:
    server = RedisServer(tmp_path).start()
    try:
        with farm_worker(server.url) as worker:
            settings = worker.settings.model_copy(update={"open_wait_s": 1.0})
            with Farm(settings) as farm:
                redis = farm.registry.redis
                started = time.monotonic()
                with pytest.raises(FarmBusy, match="no worker had room"):
                    farm.session()
                assert time.monotonic() - started < 10
                assert redis.llen(KEY) == 0  # taken back out of the list
                # a copy of an abandoned open (one the list kept, say): claimed for nobody
                abandoned = OpenRequest(
                    open_id="gone",
                    reply=answers_key("gone"),
                    sent_at=time.time(),
                    deadline=time.time() + 60,
                )
                assert farm.registry.abandon("gone")
                farm.registry.push_open(KEY, abandoned.model_dump_json())
            with consuming(worker):  # a worker that comes now opens nothing of them
                assert wait_for(lambda: worker.registry.redis.llen(KEY) == 0, 10)
                assert stays(lambda: not worker.sessions, 2.0)
    finally:
        server.stop()
