"""Shared fixtures, each a real part and each removing what it started: kernels as local
processes (and a small session helper), Docker sandboxes, a redis-server, Celery workers in this
process over the process backend, and local farms of worker processes with Docker sandboxes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from farm.kernel.wire.client import KernelClient
from farm.models import ExecResult
from farm.sandbox.process import ProcessSandbox
from tests.raw_sockets import close_opened


@pytest.fixture(autouse=True)
def close_test_sockets() -> Iterator[None]:
    """The bare kernel sockets a test opened (``tests.raw_sockets``) are closed after it."""
    yield
    close_opened()


class Cells:
    """A kernel session in a test: ``run`` validates every result against the models."""

    def __init__(self, client: KernelClient, limits: dict[str, int] | None = None) -> None:
        self.client = client
        opened = client.open_session(limits=limits)
        self.id: str = opened["session_id"]
        self.epoch: int = opened["epoch"]

    def run(self, code: str, timeout_s: float = 30.0, **kwargs: Any) -> ExecResult:
        raw = self.client.execute(self.id, code, epoch=self.epoch, timeout_s=timeout_s, **kwargs)
        result = ExecResult.model_validate(raw)
        self.epoch = result.epoch
        return result

    def value(self, code: str) -> str | None:
        result = self.run(code)
        assert result.ok, result.error
        return result.value.text if result.value else None


@pytest.fixture(scope="session")
def shared_kernel() -> Iterator[ProcessSandbox]:
    """One kernel for tests that do not break it."""
    logging.getLogger("farm.sandbox.process").setLevel(logging.ERROR)
    with ProcessSandbox() as sandbox:
        yield sandbox


@pytest.fixture
def kernel() -> Iterator[ProcessSandbox]:
    """A kernel of the test's own, for tests that kill, flood or exhaust it."""
    with ProcessSandbox(grace_s=1.0) as sandbox:
        yield sandbox


@pytest.fixture
def client(shared_kernel: ProcessSandbox) -> Iterator[KernelClient]:
    with shared_kernel.kernel() as c:
        yield c


@pytest.fixture
def cells(client: KernelClient) -> Iterator[Cells]:
    c = Cells(client)
    yield c
    client.close_session(c.id)


@pytest.fixture
def own_cells(kernel: ProcessSandbox) -> Iterator[Cells]:
    with kernel.kernel() as c:
        yield Cells(c)


# --- docker -----------------------------------------------------------------------------------

TEST_OWNER = f"pytest-{os.getpid()}"


def docker_client() -> Any:
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.fail(f"Docker is not reachable ({exc}); run `make setup` (scripts/bootstrap)")
    return client


@pytest.fixture(scope="session")
def docker_env() -> Iterator[Any]:
    """Docker and the sandbox image (built by `make setup`); removes our containers at the end."""
    from farm.sandbox.images import ensure_sandbox_image

    client = docker_client()
    ensure_sandbox_image(client)
    yield client
    for container in client.containers.list(
        ignore_removed=True, all=True, filters={"label": f"farm.owner={TEST_OWNER}"}
    ):
        container.remove(force=True)
    client.close()


def build_test_image(client: Any, **kwargs: Any) -> Any:
    """``client.images.build(**kwargs)`` holding the builds' lock, so that no other test
    process removes a layer this build uses meanwhile (``farm.sandbox.build_lock``)."""
    from farm.sandbox import build_lock

    with build_lock.building():
        image, _ = client.images.build(**kwargs)
    return image


@contextmanager
def removing_images() -> Iterator[None]:
    """A block that removes images once no build of another test process runs (removing an
    image removes its untagged parents, which such a build may be using)."""
    from farm.sandbox import build_lock
    from farm.sandbox.images import BUILD_TOTAL_TIMEOUT_S

    with build_lock.removing(wait_s=BUILD_TOTAL_TIMEOUT_S) as free:
        assert free, "image builds held their lock past a build's whole timeout"
        yield


def remove_image_tags(client: Any, tag: str) -> None:
    """Remove a test-only image ``tag`` and the pinned tags its builds got (``-k<digest>``)."""
    with removing_images():
        for image in client.images.list(name=tag.rpartition(":")[0]):
            for ref in image.tags:
                if ref == tag or ref.startswith(f"{tag}-k"):
                    client.images.remove(ref)


def make_docker_sandbox(docker_env: Any, tmp_path_factory: Any, **kwargs: Any) -> Any:
    from farm.sandbox.docker import DockerSandbox

    return DockerSandbox(
        owner=TEST_OWNER,
        socket_dir=tmp_path_factory.mktemp("sockets"),
        client=docker_env,
        **kwargs,
    )


@pytest.fixture(scope="module")
def docker_sandbox(docker_env: Any, tmp_path_factory: Any) -> Iterator[Any]:
    with make_docker_sandbox(docker_env, tmp_path_factory) as sandbox:
        yield sandbox


# A host that forbids what boxes' namespaces need (as AppArmor's docker-default forbids mount):
# Docker's seccomp profile replaced by one that refuses mount and allows the rest.
NO_MOUNT_PROFILE = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["mount"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
}


def no_mount_limits(tmp_path_factory: Any, **settings: Any) -> Any:
    """Sandbox limits under ``NO_MOUNT_PROFILE``: its kernel falls back to uid boxes."""
    from farm.settings import SandboxLimits

    profile = tmp_path_factory.mktemp("seccomp") / "no-mount.json"
    profile.write_text(json.dumps(NO_MOUNT_PROFILE))
    return SandboxLimits(seccomp_profile=profile, **settings)


@pytest.fixture(scope="module")
def uid_sandbox(docker_env: Any, tmp_path_factory: Any) -> Iterator[Any]:
    """A docker sandbox whose boxes fell back to uids (the host forbids mount)."""
    limits = no_mount_limits(tmp_path_factory)
    with make_docker_sandbox(docker_env, tmp_path_factory, limits=limits) as sandbox:
        yield sandbox


# --- farms: real redis-server, real Celery worker processes, real Docker sandboxes -----------


@pytest.fixture(scope="module")
def one_worker(docker_env: Any) -> Iterator[Any]:
    """A farm of one worker: every session of a module's tests shares its sandbox (the
    co-tenancy modules: one session attacks another on the same worker)."""
    from farm.client import Farm
    from farm.local.embedded import LocalFarm

    local = LocalFarm(1).start()
    with Farm(local.settings(), owned=local) as farm:
        yield farm


@pytest.fixture
def pair(one_worker: Any) -> Iterator[tuple[Any, Any]]:
    """Two sessions on ``one_worker``'s worker, A holding a secret (variable and file)."""
    from tests.test_reliability_adversarial import session_on

    a = one_worker.session()
    b = session_on(one_worker, a.worker)
    a.run("import os\nsecret = 'hunter2-' + 'a' * 10\nopen('mine.txt', 'w').write(secret)")
    yield a, b
    a.close()
    b.close()


@pytest.fixture(scope="module")
def farm(docker_env: Any) -> Iterator[Any]:
    """A two-worker farm shared by a module's tests that do not break it."""
    from farm.client import Farm

    with Farm.local(workers=2) as f:
        yield f


# --- fast: a real Redis and a real Celery worker in-process, over the process backend --------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: Any) -> Iterator[Any]:
    """One real redis-server for the session (loopback, a password, a free port)."""
    from farm.local.redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@contextmanager
def inproc_worker(broker_url: str) -> Iterator[tuple[Any, Any]]:
    """``(farm, worker)``: a ``Farm`` over one real Celery worker running in this process
    (``celery.contrib.testing``, threads pool) whose sandbox is the ``process`` backend. The
    client's logic meets real Redis and Celery without Docker; everything stops at the end."""
    from farm.client import Farm

    with farm_worker(broker_url) as worker, consuming(worker), Farm(worker.settings) as farm:
        yield farm, worker


@contextmanager
def farm_worker(broker_url: str) -> Iterator[Any]:
    """A started ``Worker`` (registered, its process sandbox up) that consumes nothing yet."""
    import uuid

    from farm.settings import FarmSettings
    from farm.worker.worker_state import Worker

    logging.getLogger("farm.sandbox.process").setLevel(logging.ERROR)
    settings = FarmSettings(
        broker_url=broker_url, backend="process", worker_id=f"inproc-{uuid.uuid4().hex[:8]}"
    )
    worker = Worker(settings)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop("the test is over")


@contextmanager
def consuming(worker: Any) -> Iterator[None]:
    """``worker``'s Celery consumer, its intake of map chunks and its run lane, in this
    process, until the block ends."""
    from celery.contrib.testing.worker import start_worker

    from farm.worker.tasks import make_worker_app

    app = make_worker_app(worker.settings, worker=worker)
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=worker.settings.worker_threads,
            perform_ping_check=False,
            queues=worker.queues,
            loglevel="WARNING",
            shutdown_timeout=30,
        ):
            worker.intake.start()
            worker.lane.start(worker.queue)
            try:
                yield
            finally:
                worker.lane.stop()
                worker.intake.stop()
    finally:
        app.close()  # its broker and backend connections, now rather than at some later gc


@pytest.fixture(scope="module")
def inproc_farm(redis_server: Any) -> Iterator[Any]:
    """A farm of one in-process Celery worker over the process backend (``inproc_worker``)."""
    with inproc_worker(redis_server.url) as (farm, _):
        yield farm


# --- Inspect AI provider -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def inspect_image(docker_env: Any) -> Iterator[str]:
    """The Inspect provider's default image, ``farm-sandbox:inspect`` (the sandbox image plus
    procps), which the provider's ``task_init`` builds when it is missing or stale. The tags
    this run added are removed at the end (the image too, and its build directories, when it
    did not exist before)."""
    import shutil

    from farm.integrations.inspect.config import INSPECT_IMAGE
    from farm.sandbox.environments import CONTEXT_DIR, WHEELS_DIR
    from farm.sandbox.images import default_repo_root

    def tags() -> set[str]:
        return {
            ref
            for image in docker_env.images.list(name="farm-sandbox")
            for ref in image.tags
            if ref == f"farm-sandbox:{INSPECT_IMAGE}"
            or ref.startswith(f"farm-sandbox:{INSPECT_IMAGE}-k")
        }

    before = tags()
    yield INSPECT_IMAGE
    for ref in tags() - before:
        docker_env.images.remove(ref)
    if f"farm-sandbox:{INSPECT_IMAGE}" not in before:
        root = default_repo_root()
        for directory in (WHEELS_DIR, CONTEXT_DIR):
            shutil.rmtree(root / directory / INSPECT_IMAGE, ignore_errors=True)
        (root / CONTEXT_DIR / f"{INSPECT_IMAGE}.lock").unlink(missing_ok=True)


# --- markers ------------------------------------------------------------------------------------

# Fixtures that need a Docker daemon: a test using any of them (directly or through another
# fixture) is a ``docker`` test whether or not its module says so, so `make test-fast` (not
# docker) never picks one up.
DOCKER_FIXTURES = {"docker_env", "docker_sandbox", "farm", "inspect_image"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if DOCKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)
