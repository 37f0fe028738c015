"""docker-compose.yml end to end: the images build FROM the same base as the sandbox, the stack
comes up under a project name of its own, a client on the host runs code through it with the
broker's password (made by scripts/compose-secret, as `make compose-up` does) while a client
without it is refused and the password shows in no `ps` line or log, Prometheus scrapes every
worker, scaling adds workers, a pool (the compose profile `pool`) serves another image with the
same password, and teardown leaves nothing behind.

It uses Debian's docker-compose (v1), installed by scripts/ensure-compose when missing; it
skips only when that cannot install it. The images come from scripts/build-images (what
`make images` runs), so the test exercises exactly what a user builds.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
BUILD_TIMEOUT_S = 240
UP_TIMEOUT_S = 120
READY_TIMEOUT_S = 90
SCRAPE_TIMEOUT_S = 60
DOWN_TIMEOUT_S = 60
POLL_S = 0.5
IMAGES = ("worker", "redis", "prometheus")

T = TypeVar("T")


def waited(what: str, probe: Callable[[], T | None], timeout_s: float, why: Callable[[], str]) -> T:
    """``probe()``'s first truthy value (``tests.waiting.wait_for``); at the deadline the test
    fails with ``what`` and ``why()`` (the stack's logs)."""
    value = wait_for(probe, timeout_s, POLL_S)
    if not value:
        pytest.fail(f"{what} within {timeout_s:.0f}s\n{why()}")
    return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise AssertionError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


@dataclass
class Stack:
    """One docker-compose project: its name, environment, images' tag, the broker's password
    and the client-side addresses."""

    project: str
    env: dict[str, str]
    tag: str
    password: str
    redis_url: str
    prometheus_url: str
    api_url: str
    api_token: str
    socket_dir: Path
    docker: Any
    worker_hosts: set[str] = field(default_factory=set)

    def compose(
        self, *args: str, timeout_s: float = UP_TIMEOUT_S, env: dict[str, str] | None = None
    ) -> str:
        cmd = ["docker-compose", "--ansi", "never", "-f", str(COMPOSE_FILE), "-p", self.project]
        return run([*cmd, *args], timeout_s, {**self.env, **(env or {})})

    def containers(self, service: str | None = None) -> list[Any]:
        labels = [f"com.docker.compose.project={self.project}"]
        if service:
            labels.append(f"com.docker.compose.service={service}")
        return list(
            self.docker.containers.list(ignore_removed=True, all=True, filters={"label": labels})
        )

    def remember_workers(self) -> None:
        """Worker containers' hostnames (of every pool): their sandboxes carry them as
        ``farm.host``."""
        for c in [*self.containers("worker"), *self.containers("pool")]:
            self.worker_hosts.add(str(c.attrs["Config"]["Hostname"]))

    def sandboxes(self) -> list[Any]:
        self.remember_workers()
        return [
            c
            for c in self.docker.containers.list(
                ignore_removed=True, all=True, filters={"label": "farm.managed=1"}
            )
            if c.labels.get("farm.host") in self.worker_hosts
        ]

    def logs(self) -> str:
        try:
            return self.compose("logs", "--no-color", "--tail", "40", timeout_s=30)
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            return f"(no logs: {exc})"

    def prometheus(self, path: str, **params: str) -> Any:
        url = f"{self.prometheus_url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.load(reply)["data"]

    def worker_targets(self) -> list[dict[str, Any]]:
        try:
            targets = self.prometheus("/api/v1/targets")["activeTargets"]
        except OSError:
            return []  # Prometheus not answering yet
        return [t for t in targets if t["labels"].get("job") == "farm-worker"]


def ensure_compose() -> None:
    proc = subprocess.run(
        [str(ROOT / "scripts" / "ensure-compose")],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0 or shutil.which("docker-compose") is None:
        pytest.skip(f"docker-compose is missing and could not be installed: {proc.stderr.strip()}")


def tear_down(stack: Stack) -> None:
    """``down -v``, then any sandbox a worker of this project left; fail if anything stays."""
    stack.remember_workers()
    try:
        stack.compose(
            "--profile",
            "pool",
            "down",
            "-v",
            "--remove-orphans",
            "-t",
            "20",
            timeout_s=DOWN_TIMEOUT_S,
        )
    finally:
        for container in [*stack.sandboxes(), *stack.containers()]:
            container.remove(force=True)
        shutil.rmtree(stack.socket_dir, ignore_errors=True)
    project_label = {"label": f"com.docker.compose.project={stack.project}"}
    for network in stack.docker.networks.list(filters=project_label):
        network.remove()
    for name in IMAGES:  # this run's tag only: the layers stay cached for the next build
        stack.docker.images.remove(f"farm-{name}:{stack.tag}")
    left = [c.name for c in [*stack.sandboxes(), *stack.containers()]]
    left += [n.name for n in stack.docker.networks.list(filters=project_label)]
    assert not left, f"teardown left {left}"


@pytest.fixture(scope="module")
def stack(docker_env: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The compose stack with one worker, built from this checkout under a tag of this run (a
    concurrent run of another checkout keeps its own images); removed afterwards."""
    ensure_compose()
    tag = f"pytest-{os.getpid()}"
    run(
        [str(ROOT / "scripts" / "build-images")],
        BUILD_TIMEOUT_S,
        {**os.environ, "VPY": sys.executable, "FARM_TAG": tag},
    )
    redis_port, prometheus_port, api_port = free_port(), free_port(), free_port()
    socket_dir = tmp_path_factory.mktemp("compose-sockets")
    env_file = tmp_path_factory.mktemp("compose-secret") / "compose.env"
    run([str(ROOT / "scripts" / "compose-secret"), str(env_file)], 30)
    secrets = dict(line.split("=", 1) for line in env_file.read_text().split())
    password = secrets["FARM_BROKER_PASSWORD"]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FARM_BROKER_")},
        "FARM_TAG": tag,
        "FARM_COMPOSE_ENV_FILE": str(env_file),
        "FARM_REDIS_PORT": str(redis_port),
        "FARM_PROMETHEUS_PORT": str(prometheus_port),
        "FARM_API_PORT": str(api_port),
        "FARM_SOCKET_DIR": str(socket_dir),
    }
    built = Stack(
        project=f"farmtest{os.getpid()}",
        env=env,
        tag=tag,
        password=password,
        redis_url=f"redis://127.0.0.1:{redis_port}/0",
        prometheus_url=f"http://127.0.0.1:{prometheus_port}",
        api_url=f"http://127.0.0.1:{api_port}",
        api_token=secrets["FARM_API_TOKEN"],
        socket_dir=socket_dir,
        docker=docker_env,
    )
    try:
        built.compose("up", "-d", "--no-build")
        built.remember_workers()
        yield built
    finally:
        tear_down(built)


@pytest.fixture(scope="module")
def farm(stack: Stack) -> Iterator[Any]:
    from farm.client import Farm
    from farm.settings import FarmSettings

    # as a client on the host does: the URL, and the password from the stack's env file
    client = Farm(FarmSettings(broker_url=stack.redis_url, broker_password=stack.password))
    try:
        yield client
    finally:
        client.close()


def ready_workers(farm: Any, n: int) -> Callable[[], list[dict[str, Any]] | None]:
    def probe() -> list[dict[str, Any]] | None:
        try:
            ready = [w for w in farm.workers() if w.get("ready")]
        except Exception:
            return None
        return ready if len(ready) == n else None

    return probe


def some_ready_worker(farm: Any) -> Callable[[], bool]:
    """Whether any worker is ready (the scaling test may have added one)."""

    def probe() -> bool:
        try:
            return any(w.get("ready") for w in farm.workers())
        except Exception:
            return False

    return probe


def test_a_host_client_runs_code_on_the_compose_farm(stack: Stack, farm: Any) -> None:
    (worker,) = waited(
        "one compose worker was not ready", ready_workers(farm, 1), READY_TIMEOUT_S, stack.logs
    )
    assert worker["sandbox"]["backend"] == "docker"
    with farm.session() as session:
        session.run("x = 6 * 7")
        result = session.run("x")
        assert result.ok, result.error
        assert result.value.text == "42"
        assert result.worker == worker["id"]
    (sandbox,) = stack.sandboxes()
    assert sandbox.attrs["HostConfig"]["NetworkMode"] == "none"


def test_the_api_service_runs_code_for_its_token_only(stack: Stack, farm: Any) -> None:
    import httpx

    waited("no ready worker", some_ready_worker(farm), READY_TIMEOUT_S, stack.logs)

    def answers() -> bool:
        try:
            return httpx.get(f"{stack.api_url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    waited("the api service did not answer", answers, READY_TIMEOUT_S, stack.logs)
    run_ = {"code": "6 * 7"}
    refused = httpx.post(f"{stack.api_url}/v1/run", json=run_, timeout=60)
    assert refused.status_code == 401
    headers = {"Authorization": f"Bearer {stack.api_token}"}
    result = httpx.post(f"{stack.api_url}/v1/run", json=run_, headers=headers, timeout=60)
    assert result.status_code == 200 and result.json()["value"]["text"] == "42"


def test_user_code_in_a_compose_sandbox_has_no_network(stack: Stack, farm: Any) -> None:
    with farm.session() as session:
        interfaces = session.run("import socket\nsorted(n for _, n in socket.if_nameindex())")
        assert interfaces.value.text == "['lo']"
        reach = session.run("socket.create_connection(('redis', 6379), timeout=2)")
        assert reach.error is not None and reach.error.kind == "user", reach
        assert reach.error.ename in (
            "gaierror",
            "OSError",
            "TimeoutError",
            "ConnectionRefusedError",
        )


def test_prometheus_scrapes_the_worker_metrics(stack: Stack, farm: Any) -> None:
    waited("the worker was not ready", ready_workers(farm, 1), READY_TIMEOUT_S, stack.logs)
    (worker_container,) = stack.containers("worker")
    ip = next(iter(worker_container.attrs["NetworkSettings"]["Networks"].values()))["IPAddress"]

    def up() -> list[dict[str, Any]] | None:
        targets = [t for t in stack.worker_targets() if t["health"] == "up"]
        return targets or None

    (target,) = waited("Prometheus did not scrape the worker", up, SCRAPE_TIMEOUT_S, stack.logs)
    assert target["scrapeUrl"] == f"http://{ip}:9100/metrics"

    def sandbox_up() -> list[dict[str, Any]] | None:
        return stack.prometheus("/api/v1/query", query="farm_sandbox_up == 1")["result"] or None

    (sample,) = waited(
        "farm_sandbox_up was not 1 in Prometheus", sandbox_up, SCRAPE_TIMEOUT_S, stack.logs
    )
    assert sample["metric"]["instance"] == f"{ip}:9100"


def test_scaling_to_two_workers_adds_a_worker_and_a_scrape_target(stack: Stack, farm: Any) -> None:
    stack.compose("up", "-d", "--no-build", "--no-recreate", "--scale", "worker=2")
    stack.remember_workers()
    workers = waited(
        "two compose workers were not ready", ready_workers(farm, 2), READY_TIMEOUT_S, stack.logs
    )
    assert len({w["id"] for w in workers}) == 2
    assert len(stack.containers("worker")) == 2

    def two_up() -> list[dict[str, Any]] | None:
        targets = [t for t in stack.worker_targets() if t["health"] == "up"]
        return targets if len(targets) == 2 else None

    waited("Prometheus did not scrape both workers", two_up, SCRAPE_TIMEOUT_S, stack.logs)
    assert farm.run("sum(range(10))").value.text == "45"


def test_a_pool_profile_serves_another_image_with_its_own_limits(stack: Stack, farm: Any) -> None:
    """docker-compose.yml's ``pool`` service, as docs/deployment.md documents it: workers of another
    farm image (here the default image under a name of its own, as ``farm image build`` would
    tag an environment) take that image's runs, with the pool's limits and the same hardening,
    and Prometheus finds them."""
    image = f"pytest-pool-{os.getpid()}"
    stack.docker.images.get("farm-sandbox:default").tag("farm-sandbox", image)
    pool_env = {"FARM_POOL_IMAGE": image, "FARM_POOL_SANDBOX_MEMORY_MB": "600"}
    try:
        stack.compose(
            "--profile", "pool", "up", "-d", "--no-build", "--no-recreate", "pool", env=pool_env
        )
        stack.remember_workers()

        def pool_ready() -> list[dict[str, Any]] | None:
            return [w for w in farm.workers() if w.get("ready") and w["image"] == image] or None

        (worker,) = waited(
            "the pool's worker was not ready", pool_ready, READY_TIMEOUT_S, stack.logs
        )
        assert worker["sandbox"]["limits"]["memory_mb"] == 600
        result = farm.run("6 * 7", image=image)
        assert result.ok and result.value.text == "42" and result.worker == worker["id"]
        (pool_container,) = stack.containers("pool")
        host = pool_container.attrs["Config"]["Hostname"]
        (sandbox,) = [c for c in stack.sandboxes() if c.labels.get("farm.host") == host]
        assert sandbox.attrs["HostConfig"]["NetworkMode"] == "none"
        # the pool's memory, and beside it the boxes' disks (tmpfs: FARM_SANDBOX_DISK_MB)
        assert sandbox.attrs["HostConfig"]["Memory"] == (600 + 6144) * 1024 * 1024

        def scraped() -> list[dict[str, Any]] | None:
            try:
                targets = stack.prometheus("/api/v1/targets")["activeTargets"]
            except OSError:
                return None
            return [t for t in targets if t["labels"]["job"] == "farm-pool" and t["health"] == "up"]

        waited("Prometheus did not scrape the pool's worker", scraped, SCRAPE_TIMEOUT_S, stack.logs)
        # the pool's workers read the broker's password from the same env file, never print it
        pool_logs = stack.compose("--profile", "pool", "logs", "--no-color", "pool", env=pool_env)
        assert "redis://:**@redis:6379/0" in pool_logs and stack.password not in pool_logs
        stack.compose("--profile", "pool", "rm", "--stop", "--force", "pool", env=pool_env)
    finally:
        stack.docker.images.remove(f"farm-sandbox:{image}")


# --- the control plane ------------------------------------------------------------------------


def test_the_env_file_holding_the_broker_password_is_private(stack: Stack) -> None:
    env_file = Path(stack.env["FARM_COMPOSE_ENV_FILE"])
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert env_file.parent.stat().st_mode & 0o077 == 0
    assert len(stack.password) == 64
    before = env_file.read_text()
    run([str(ROOT / "scripts" / "compose-secret"), str(env_file)], 30)
    assert env_file.read_text() == before, "an existing secret is kept"


def test_the_compose_broker_refuses_clients_without_the_password(stack: Stack, farm: Any) -> None:
    from farm.client import Farm
    from farm.errors import BrokerAuthFailed

    waited("no compose worker was ready", some_ready_worker(farm), READY_TIMEOUT_S, stack.logs)
    port = int(stack.env["FARM_REDIS_PORT"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"PING\r\n")
        assert conn.recv(256).startswith(b"-NOAUTH")
    with Farm.connect(stack.redis_url) as anonymous, pytest.raises(BrokerAuthFailed):
        anonymous.run("6 * 7")
    assert farm.run("6 * 7").value.text == "42"


def test_the_broker_password_is_in_no_ps_line_and_no_log(stack: Stack, farm: Any) -> None:
    waited("no compose worker was ready", some_ready_worker(farm), READY_TIMEOUT_S, stack.logs)
    assert farm.run("1 + 1").value.text == "2"
    ps = run(["ps", "axww", "-o", "pid,args"], 30)
    assert "redis-server" in ps and "farm.worker" in ps  # the stack's processes are listed
    assert stack.password not in ps
    logs = stack.compose("logs", "--no-color", timeout_s=60)
    assert "redis://:**@redis:6379/0" in logs, "the worker's Celery banner names the broker"
    assert stack.password not in logs


def test_farm_redis_refuses_to_start_without_a_password(stack: Stack) -> None:
    import docker.errors

    with pytest.raises(docker.errors.ContainerError) as failed:
        stack.docker.containers.run(f"farm-redis:{stack.tag}", remove=True, stderr=True)
    assert failed.value.exit_status == 1
    assert b"refusing to serve an open broker" in (failed.value.stderr or b"")
