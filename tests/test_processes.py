"""Local processes a farm starts (redis-server, workers) are tied to this process, not to the
thread that happened to start them."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from farm.processes import pid_alive
from farm.redis_server import RedisServer
from tests.waiting import stays, wait_for


def test_a_child_started_from_a_thread_that_ends_lives_on(tmp_path: Path) -> None:
    """Linux sends PR_SET_PDEATHSIG when the forking *thread* exits: a farm started from
    ``asyncio.to_thread`` or a pool's worker lost its broker the moment that thread ended."""
    started: dict[str, RedisServer] = {}
    thread = threading.Thread(target=lambda: started.update(server=RedisServer(tmp_path).start()))
    thread.start()
    thread.join(30)
    server = started["server"]
    try:
        assert server.proc is not None
        # the signal, if tied to the thread, comes as the thread exits: watch the server live on
        assert stays(lambda: server.proc is not None and server.proc.poll() is None, 1.0)
        assert server.client().ping()
    finally:
        server.stop()


def test_a_child_still_dies_with_this_process(tmp_path: Path) -> None:
    """The other half: a process that starts a redis-server and is killed takes it along."""
    script = (
        "import sys, pathlib\n"
        "from farm.redis_server import RedisServer\n"
        f"server = RedisServer(pathlib.Path({str(tmp_path)!r})).start()\n"
        "print(server.proc.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert pid_alive(child)
        parent.kill()
        parent.wait(30)
    assert wait_for(lambda: not pid_alive(child), 30), "redis-server outlived its parent"
