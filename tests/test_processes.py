"""Local processes a farm starts (redis-server, workers) are tied to this process, not to the
thread that happened to start them; the ``process`` backend's kernel does not inherit farm's
secrets from its worker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from farm.client import Farm
from farm.local.embedded import LocalFarm
from farm.local.processes import pid_alive
from farm.local.redis_server import RedisServer
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


@contextmanager
def a_parent(script: str) -> Iterator[tuple[Any, ...]]:
    """A Python process running ``script``, which prints a line of pids, then waits on its
    stdin: yields the process and those pids. The process is killed at the end of the block."""
    script += "\nimport sys\nsys.stdin.read()\n"
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        try:
            yield parent, *(int(pid) for pid in parent.stdout.readline().split())
        finally:
            parent.kill()
            parent.wait(30)


@contextmanager
def redis_of_a_parent(
    tmp_path: Path, prelude: str = ""
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A Python process that runs ``prelude``, then starts a redis-server and waits: yields the
    process and the redis-server's pid. Whatever the test did, neither outlives the block."""
    script = (
        "import signal, sys, pathlib\n"
        f"{prelude}\n"
        "from farm.local.redis_server import RedisServer\n"
        f"server = RedisServer(pathlib.Path({str(tmp_path)!r})).start()\n"
        "print(server.proc.pid, flush=True)\n"
    )
    with a_parent(script) as (parent, child):
        try:
            yield parent, child
        finally:
            parent.kill()
            parent.wait(30)
            with contextlib.suppress(OSError):  # gone already, as it should be
                if b"redis-server" in Path(f"/proc/{child}/cmdline").read_bytes():
                    os.kill(child, signal.SIGKILL)


def test_a_child_still_dies_with_this_process(tmp_path: Path) -> None:
    """The other half: a process that starts a redis-server and is killed takes it along."""
    with redis_of_a_parent(tmp_path) as (parent, child):
        assert pid_alive(child)
        parent.kill()
        parent.wait(30)
        assert wait_for(lambda: not pid_alive(child), 30), "redis-server outlived its parent"


def test_a_child_of_a_process_that_blocks_sigterm_still_gets_it(tmp_path: Path) -> None:
    """``farm up`` blocks SIGTERM and SIGINT to wait for them; its redis and workers must not
    inherit that mask: they would ignore ``farm down`` and outlive a killed ``farm up``."""
    block = "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})"
    with redis_of_a_parent(tmp_path, prelude=block) as (parent, child):
        status = Path(f"/proc/{child}/status").read_text()
        assert "SigBlk:\t0000000000000000" in status, status
        parent.kill()
        parent.wait(30)
        assert wait_for(lambda: not pid_alive(child), 30), "redis-server outlived its parent"


def test_user_code_in_a_process_sandbox_sees_none_of_farms_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker of the ``process`` backend holds the broker's credentials in its environment
    (``FARM_BROKER_URL`` with the password, here also ``FARM_BROKER_PASSWORD``, and redis-cli's
    ``REDISCLI_AUTH``); the code and the commands of its sessions see none of them, nor any
    other ``FARM_*`` setting."""
    canaries = {"FARM_BROKER_PASSWORD": "canary-farm-0815", "REDISCLI_AUTH": "canary-cli-0815"}
    monkeypatch.setenv("FARM_IDLE_TIMEOUT_S", "900")  # a setting workers inherit
    # a worker started anew: a forked one's /proc/PID/environ is its server's, set at exec
    local_farm = LocalFarm(1, backend="process", env=canaries, spare=False)
    with local_farm as local, Farm(local.settings()) as farm:
        password = urlsplit(farm.settings.broker_url).password
        assert password
        (worker,) = local.workers.values()
        worker_env = Path(f"/proc/{worker.pid}/environ").read_bytes().decode()
        secrets = [password, *canaries.values()]
        assert all(secret in worker_env for secret in secrets), "the worker holds them all"
        with farm.session() as session:
            result = session.run("import json, os\nprint(json.dumps(dict(os.environ)))")
            assert result.ok, result.error
            code_env: dict[str, str] = json.loads(result.stdout)
            command_env = session.exec(["env"]).stdout
        assert "FARM_KERNEL_TOKEN" not in code_env  # the kernel's own: gone before user code
        assert [k for k in code_env if k.upper().startswith("FARM_")] == []
        assert not set(canaries) & set(code_env)
        for secret in secrets:
            assert secret not in json.dumps(code_env) and secret not in command_env
        assert "FARM_" not in command_env and "REDISCLI_AUTH" not in command_env
        assert code_env.get("PATH")  # the rest of the environment is still there


def descendants(root: int) -> dict[int, str]:
    """``root`` and every process below it, each with its start time (its identity: a pid
    may be reused), read from ``/proc``."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stats[int(entry.name)] = (entry / "stat").read_text().rpartition(")")[2].split()
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats and stats[pid][0] != "Z":
            found[pid] = stats[pid][19]
            todo += [child for child, fields in stats.items() if int(fields[1]) == pid]
    return found


def still_running(processes: dict[int, str]) -> list[int]:
    """Those of ``processes`` (pid: start time) that still run."""
    alive = []
    for pid, started in processes.items():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            if fields[19] == started and fields[0] != "Z":
                alive.append(pid)
    return alive


def test_a_process_sandbox_dies_with_its_worker_killed_by_sigkill() -> None:
    """A worker of the ``process`` backend killed with SIGKILL (a ``LocalFarm.close`` that
    escalates) takes its kernel, the kernel's zygote and its boxes along: they used to run on
    with PPID 1. The worker starts its sandbox from a thread that ends, as ``farm.worker`` does
    while Celery sets up, so a tie to that thread would not do either."""
    script = (
        "import threading\n"
        "from farm.sandbox.process import ProcessSandbox\n"
        "box = {}\n"
        "t = threading.Thread(target=lambda: box.update(s=ProcessSandbox()))\n"
        "t.start(); t.join()\n"
        "t = threading.Thread(target=box['s'].start)\n"
        "t.start(); t.join()\n"
        "with box['s'].kernel() as client:\n"
        "    client.open_session(session_id='s1')\n"
        "print(box['s'].proc.pid, flush=True)\n"
    )
    with a_parent(script) as (parent, kernel):
        tree = descendants(kernel)
        try:
            assert len(tree) >= 3, tree  # the kernel, its zygote, a session's box
            parent.kill()
            parent.wait(30)
            assert wait_for(lambda: not still_running(tree), 30), still_running(tree)
        finally:
            for pid in still_running(tree):  # whatever the test saw, nothing outlives it
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
