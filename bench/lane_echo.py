"""A bare Redis-list echo: what a call between two hosts' processes costs through Redis alone.

The client pushes a request (JSON) on one list and blocks on a reply list of its own; a server
process of ``THREADS`` threads, each blocked on the request list, pushes each request back
(with ``EXPIRE`` on the reply list, in one pipeline). Two commands each way and nothing else:
no task envelope, no result backend, no acknowledgement. ``bench/run_path.py`` sets it beside
Celery's echo task to show what Celery's own machinery costs per call.

Server: ``python bench/lane_echo.py REDIS_URL``; the client side is ``LaneEcho``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from farm.local.processes import popen_tied

REQUESTS = "bench:lane:requests"
THREADS = 4
REPLY_TTL_S = 60
STOP = "stop"


def _serve_one(url: str) -> None:
    client = redis.Redis.from_url(url)
    while True:
        popped = client.blpop([REQUESTS])
        assert popped is not None  # no timeout: it blocks until a request comes
        request = json.loads(popped[1])
        if request == STOP:
            return
        key = f"bench:lane:reply:{request['exec_id']}"
        pipe = client.pipeline(transaction=False)
        pipe.lpush(key, json.dumps({"status": "ok", "result": request}))
        pipe.expire(key, REPLY_TTL_S)
        pipe.execute()


def serve(url: str) -> None:
    threads = [threading.Thread(target=_serve_one, args=(url,)) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class LaneEcho:
    """The client: ``call(payload)`` sends ``payload`` and waits for it to come back."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)

    def call(self, payload: dict[str, Any]) -> None:
        request = dict(payload, exec_id=uuid.uuid4().hex)
        self.client.lpush(REQUESTS, json.dumps(request))
        popped = self.client.blpop([f"bench:lane:reply:{request['exec_id']}"], timeout=30)
        if popped is None or json.loads(popped[1])["result"] != request:
            raise RuntimeError("the lane echo did not answer its request")


@contextmanager
def lane_server(url: str) -> Iterator[int]:
    """A running echo server on ``url`` (its pid), stopped at the end."""
    proc = popen_tied([sys.executable, str(Path(__file__)), url])
    try:
        yield proc.pid
    finally:
        stopper = redis.Redis.from_url(url)
        stopper.lpush(REQUESTS, *[json.dumps(STOP)] * THREADS)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stopper.close()


if __name__ == "__main__":
    serve(sys.argv[1])
