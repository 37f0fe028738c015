"""A local farm's worker server (``farm.local.spares``): every worker whose interpreter it
matches is forked from it, as the farm's own child (waited and signalled as one), with that
worker's identity and settings; a server gone costs only the usual start; all of it ends with
the farm (closed, or its owner killed) leaving no process or container behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm
from farm.local.embedded import LocalFarm
from farm.local.processes import pid_alive
from tests.test_processes import a_parent
from tests.waiting import wait_for


def worker_of(local: LocalFarm, image: str) -> str:
    return next(w for w, served in local.worker_images.items() if served == image)


def forked(pid: int) -> bool:
    """Whether ``pid`` is a fork of the worker server (its command line is the server's)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return b"farm.worker.spare" in f.read()


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_workers_are_the_farm_s_children_forked_from_the_server_and_end_with_it() -> None:
    with LocalFarm(1, backend="process") as local, Farm(local.settings(), owned=local) as farm:
        server = local.server_pid
        assert server is not None and pid_alive(server)
        result = farm.run("import os\nprint(6 * 7)", image="other")
        assert result.ok, result.error
        assert result.stdout.strip() == "42"
        worker = worker_of(local, "other")
        pids = [proc.pid for proc in local.workers.values()]
        assert len(pids) == 2 and server not in pids
        assert all(forked(pid) and parent_of(pid) == os.getpid() for pid in pids)
        entry = next(w for w in farm.registry.workers() if w["id"] == worker)
        assert entry["image"] == "other" and entry["pid"] == local.workers[worker].pid
        assert "generation 1 serving image other" in (local.dir / f"{worker}.log").read_text()
        assert local.server_pid == server  # the same server, for the image after
        environ = Path(f"/proc/{server}/environ").read_bytes()
        assert b"FARM_BROKER_URL" not in environ  # it knows no broker
    assert wait_for(lambda: not any(pid_alive(pid) for pid in [*pids, server]), 30)


def test_a_forked_worker_s_exit_is_waited_for_as_a_child_s() -> None:
    with LocalFarm(1, backend="process") as local:
        worker, proc = next(iter(local.workers.items()))
        assert proc.poll() is None
        local.kill_worker(worker)
        assert proc.wait(30) == -signal.SIGKILL and proc.poll() == -signal.SIGKILL


def test_a_farm_without_the_server_starts_workers_the_usual_way() -> None:
    with LocalFarm(1, backend="process", spare=False) as local:
        assert local.server_pid is None
        worker = local.serve_image("other")
        assert not forked(local.workers[worker].pid)
        assert "generation 1 serving image other" in (local.dir / f"{worker}.log").read_text()


def test_a_server_gone_leaves_the_usual_start() -> None:
    with LocalFarm(1, backend="process") as local:
        server = local.server_pid
        assert server is not None
        os.kill(server, signal.SIGKILL)
        worker = local.serve_image("other")
        assert not forked(local.workers[worker].pid)


def test_the_server_and_the_workers_die_with_the_process_that_owns_the_farm() -> None:
    """The server and the workers go when the farm's owner is killed (SIGKILL): a worker gets
    SIGTERM from its tie and stops, though the farm's redis-server is gone too."""
    script = (
        "from farm.local.embedded import LocalFarm\n"
        "local = LocalFarm(1, backend='process').start()\n"
        "print(local.server_pid, *[w.pid for w in local.workers.values()], flush=True)\n"
    )
    with a_parent(script) as started:
        owner, server, *workers = started
        assert pid_alive(server) and workers and all(map(pid_alive, workers))
        assert all(map(forked, workers))
        owner.kill()
        owner.wait(30)
        assert wait_for(lambda: not pid_alive(server), 30), "the server outlived its farm's owner"
        gone = wait_for(lambda: not any(map(pid_alive, workers)), 60)
        assert gone, "a worker outlived its farm's owner"


@pytest.mark.docker
def test_a_forked_worker_serves_a_docker_image_and_leaves_no_container(docker_env: Any) -> None:
    from farm.sandbox.docker import LABEL_OWNER
    from farm.sandbox.images import own_sandbox_tag

    name = f"spare-test-{os.getpid()}"  # an environment no worker serves: the default, renamed
    docker_env.images.get(own_sandbox_tag()).tag("farm-sandbox", name)
    try:
        with LocalFarm(1) as local, Farm(local.settings(), owned=local) as farm:
            result = farm.run("print(1)", image=name)
            assert result.ok, result.error
            assert forked(local.workers[worker_of(local, name)].pid)
            owners = list(local.workers)
    finally:
        docker_env.images.remove(f"farm-sandbox:{name}")
    left = docker_env.containers.list(all=True, filters={"label": LABEL_OWNER})
    assert not [c for c in left if c.labels.get(LABEL_OWNER) in owners]


def test_a_worker_whose_interpreter_differs_is_not_forked_from_the_server() -> None:
    """``PYTHON*`` variables are read at an interpreter's start: the server's are its own."""
    with LocalFarm(1, backend="process") as local:
        server = local.server_pid
        worker = local.add_worker("other", PYTHONHASHSEED="7")
        assert not forked(local.workers[worker].pid)
        assert local.server_pid == server and server is not None and pid_alive(server)
        local.wait_ready([worker])
