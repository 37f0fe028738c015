"""A local farm's spare worker process (``farm.local.spares``): the next image on demand is
served by it, it takes that worker's identity and settings, and it ends with the farm (closed,
or its owner killed) leaving no process or container behind."""

from __future__ import annotations

import os
from typing import Any

import pytest

from farm.client import Farm
from farm.local.embedded import LocalFarm
from farm.local.processes import pid_alive
from tests.test_processes import a_parent
from tests.waiting import wait_for


def worker_of(local: LocalFarm, image: str) -> str:
    return next(w for w, served in local.worker_images.items() if served == image)


def test_the_spare_becomes_the_worker_of_the_next_image_and_ends_with_the_farm() -> None:
    with LocalFarm(1, backend="process") as local, Farm(local.settings(), owned=local) as farm:
        spare = local.spare_pid
        assert spare is not None and pid_alive(spare)
        result = farm.run("import os\nprint(6 * 7)", image="other")
        assert result.ok, result.error
        assert result.stdout.strip() == "42"
        worker = worker_of(local, "other")
        assert local.workers[worker].pid == spare  # the spare serves it, as that worker
        entry = next(w for w in farm.registry.workers() if w["id"] == worker)
        assert entry["image"] == "other" and entry["pid"] == spare
        assert "generation 1 serving image other" in (local.dir / f"{worker}.log").read_text()
        again = local.spare_pid  # a new one, for the image after
        assert again is not None and again != spare
        pids = [proc.pid for proc in local.workers.values()] + [again]
    assert wait_for(lambda: not any(pid_alive(pid) for pid in pids), 30), "a process outlived"


def test_a_farm_without_a_spare_starts_workers_on_demand_the_usual_way() -> None:
    with LocalFarm(1, backend="process", spare=False) as local:
        assert local.spare_pid is None
        worker = local.serve_image("other")
        assert local.spare_pid is None
        assert "generation 1 serving image other" in (local.dir / f"{worker}.log").read_text()


def test_a_spare_dies_with_the_process_that_owns_its_farm() -> None:
    """The spare, and the worker, go when the farm's owner is killed (SIGKILL): the worker
    gets SIGTERM from its tie and stops, though the farm's redis-server is gone too."""
    script = (
        "from farm.local.embedded import LocalFarm\n"
        "local = LocalFarm(1, backend='process').start()\n"
        "print(local.spare_pid, *[w.pid for w in local.workers.values()], flush=True)\n"
    )
    with a_parent(script) as started:
        owner, spare, *workers = started
        assert pid_alive(spare) and workers and all(map(pid_alive, workers))
        owner.kill()
        owner.wait(30)
        assert wait_for(lambda: not pid_alive(spare), 30), "the spare outlived its farm's owner"
        gone = wait_for(lambda: not any(map(pid_alive, workers)), 60)
        assert gone, "a worker outlived its farm's owner"


@pytest.mark.docker
def test_a_spare_serves_a_docker_image_and_leaves_no_container(docker_env: Any) -> None:
    from farm.sandbox.docker import LABEL_OWNER
    from farm.sandbox.images import own_sandbox_tag

    name = f"spare-test-{os.getpid()}"  # an environment no worker serves: the default, renamed
    docker_env.images.get(own_sandbox_tag()).tag("farm-sandbox", name)
    try:
        with LocalFarm(1) as local, Farm(local.settings(), owned=local) as farm:
            spare = local.spare_pid
            result = farm.run("print(1)", image=name)
            assert result.ok, result.error
            assert local.workers[worker_of(local, name)].pid == spare
            owners = list(local.workers)
    finally:
        docker_env.images.remove(f"farm-sandbox:{name}")
    left = docker_env.containers.list(all=True, filters={"label": LABEL_OWNER})
    assert not [c for c in left if c.labels.get(LABEL_OWNER) in owners]


def test_a_worker_whose_interpreter_differs_is_not_made_of_the_spare() -> None:
    """``PYTHON*`` variables are read at an interpreter's start: the spare's are its own."""
    with LocalFarm(1, backend="process") as local:
        spare = local.spare_pid
        worker = local.add_worker("other", PYTHONHASHSEED="7")
        assert local.workers[worker].pid != spare
        assert local.spare_pid == spare  # kept for the next one
        local.wait_ready([worker])
