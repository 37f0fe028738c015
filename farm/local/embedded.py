"""``LocalFarm``: an embedded farm for one process — a ``redis-server`` on a free loopback
port and N worker processes with their sandboxes. Everything it starts it stops and removes on
``close()`` (also after Ctrl-C, via the context manager), containers by their owner label.
Tests use it too, so the test farm is the real one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from farm.errors import SandboxUnavailable
from farm.image_name import ImageName, ServedImage
from farm.local.processes import pid_alive, popen_tied
from farm.local.redis_server import RedisServer, ServerTLS
from farm.local.spares import Forked, WorkerServer
from farm.registry import Registry
from farm.settings import FarmSettings

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
READY_POLL_S = 0.005  # a worker's registration is one small read: a first result waits less
STOP_TIMEOUT_S = 20.0
DIR_PREFIX = "farm-local-"
OWNER_FILE = "owner.pid"  # the pid of the process that owns a local farm's directory


def stale_dirs(root: Path | None = None) -> list[Path]:
    """Directories of local farms whose owner died without its ``close()`` (a SIGKILL): its
    redis-server and workers died with it (``die_with_parent``), their logs stay. A directory
    without an owner file is left alone (being made, or not ours to judge)."""
    stale = []
    for path in sorted((root or Path(tempfile.gettempdir())).glob(f"{DIR_PREFIX}*")):
        try:
            owner = int((path / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not pid_alive(owner):
            stale.append(path)
    return stale


class LocalFarm:
    def __init__(
        self,
        workers: int | dict[str, int] = 2,
        *,
        backend: str = "docker",
        env: dict[str, str] | None = None,
        tls: ServerTLS | None = None,
        spare: bool = True,
    ) -> None:
        asked = workers if isinstance(workers, dict) else {"default": workers}
        self.images = {ImageName(image).asked: count for image, count in asked.items()}
        self.backend = backend
        self.extra_env = env or {}
        self.tag = uuid.uuid4().hex[:8]
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
        (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        self.tls = tls
        self.redis = RedisServer(self.dir, tls=tls)
        self.workers: dict[str, subprocess.Popen[bytes] | Forked] = {}
        self.worker_images: dict[str, str] = {}
        self._count = 0
        self._serving = threading.Lock()
        self.spare = spare  # fork workers from a server that imported their code once
        self._server: WorkerServer | None = None
        self._bundling: threading.Thread | None = None
        self._docker: Any = None  # the Docker client images are prepared with (docker SDK)

    @property
    def broker_url(self) -> str:
        """With the broker's password: for this farm's processes, never to be printed."""
        return self.redis.url

    def settings(self) -> FarmSettings:
        """This farm's broker, whatever FARM_BROKER_* the caller's environment names."""
        return FarmSettings(broker_url=self.broker_url, **self._tls_files())

    def _tls_files(self) -> dict[str, Any]:
        """The ``FarmSettings`` TLS files of this farm's broker: its CA and the client
        certificate it demands, if any; none for a plain broker (files meant for another
        broker, in the caller's FARM_BROKER_TLS_*, must not reach its clients)."""
        tls = self.tls
        return {
            "broker_tls_ca_file": tls.ca_file if tls else None,
            "broker_tls_cert_file": tls.client_cert_file if tls else None,
            "broker_tls_key_file": tls.client_key_file if tls else None,
        }

    def start(self) -> LocalFarm:
        try:
            if self.spare:  # its imports overlap the broker's start and the images' checks
                self._server = WorkerServer(self.dir / "worker-server.log", self._process_env())
            self._start_redis()
            self._bundle_ahead()
            for image, count in self.images.items():
                prepared = self._prepare(ImageName.parse(image))
                for _ in range(count):
                    self.add_worker(prepared)
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _start_redis(self) -> None:
        self.redis = RedisServer(self.dir, tls=self.tls).start()

    def _bundle_ahead(self) -> None:
        """Make the kernel bundle (``farm.sandbox.bundle``) in a thread while the first workers
        start: an image without farm's kernel served later finds it made, bytecode included
        (a few hundred ms of CPU to compile, off that image's first result)."""
        if self.backend == "process":
            return
        from farm.sandbox.bundle import kernel_bundle

        def make() -> None:
            with contextlib.suppress(OSError):  # the first worker that needs it makes it
                kernel_bundle(self.dir / "sockets")

        self._bundling = threading.Thread(target=make, name="farm-kernel-bundle", daemon=True)
        self._bundling.start()

    def add_worker(self, image: str | ImageName | ServedImage = "default", **env: str) -> str:
        """Start one more worker process; returns its worker id. A ``ServedImage`` (what
        ``serve_image`` prepared) is handed to it as it is, unless ``FARM_SANDBOX_IMAGE`` names
        another image for it."""
        served = image if isinstance(image, ServedImage) else None
        name = image.name if isinstance(image, ServedImage) else ImageName.parse(image)
        self._count += 1
        worker_id = f"local-{self.tag}-{self._count}"
        worker_env = self._base_env()
        worker_env.update(
            {
                "FARM_WORKER_ID": worker_id,
                "FARM_BACKEND": self.backend,
                "FARM_IMAGE": name.asked,
                **env,
            }
        )
        if served is not None and not worker_env.get("FARM_SANDBOX_IMAGE"):
            worker_env["FARM_SERVED_IMAGE"] = served.to_json()
        self.workers[worker_id] = self._launch(worker_env, self.dir / f"{worker_id}.log")
        self.worker_images[worker_id] = name.asked
        return worker_id

    def _process_env(self) -> dict[str, str]:
        """The caller's environment (less its broker) and this farm's ``env``: the worker
        server's, which knows no broker."""
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("FARM_BROKER_")}
        return {**inherited, **self.extra_env}

    def _base_env(self) -> dict[str, str]:
        """What every worker of this farm gets: ``_process_env``, this farm's broker and
        sockets."""
        tls = {f"FARM_{k.upper()}": str(v) for k, v in self._tls_files().items() if v}
        docker = {}
        if self._docker is not None:  # the API version agreed with the daemon: none asks again
            from farm.sandbox.images import API_VERSION_ENV

            docker[API_VERSION_ENV] = str(self._docker.api.api_version)
        return {
            **docker,
            **self._process_env(),
            **tls,
            "FARM_BROKER_URL": self.broker_url,
            "FARM_METRICS_PORT": "0",
            "FARM_SOCKET_DIR": str(self.dir / "sockets"),
        }

    def _launch(self, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes] | Forked:
        """A worker process of ``env``: forked by the server when it can (it has imported the
        worker's code already), else a new interpreter."""
        server = self._server
        if server is not None and server.fits(env):
            forked = server.launch(env, log_path)
            if forked is not None:
                return forked
        with log_path.open("wb") as log_file:
            return popen_tied(
                [sys.executable, "-m", "farm.worker"],
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def server_pid(self) -> int | None:
        """The pid of the process this farm forks its workers from, while it keeps one."""
        return self._server.proc.pid if self._server is not None else None

    def wait_ready(
        self, worker_ids: list[str] | None = None, timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        wanted = sorted(set(worker_ids or self.workers))
        registry = Registry.connect(self.settings())
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                ready = registry.ready_among(wanted)
                if ready.issuperset(wanted):
                    return
                dead = [w for w in wanted if self.workers[w].poll() is not None]
                if dead or time.monotonic() > deadline:
                    logs = "\n".join(self.log_tail(w) for w in dead or sorted(set(wanted) - ready))
                    raise SandboxUnavailable(f"workers did not become ready: {logs}")
                time.sleep(READY_POLL_S)  # poll interval of the deadline-bounded readiness check
        finally:
            registry.close()

    def log_tail(self, worker_id: str, lines: int = 30) -> str:
        path = self.dir / f"{worker_id}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return f"--- {worker_id}\n" + "\n".join(text.splitlines()[-lines:])

    def serve_image(self, image: str | ImageName) -> str:
        """Start a worker for ``image`` on demand; returns its id.

        The image is made ready and resolved once (``catalog.prepare``): ``default`` and the
        variants farm defines (``docs``, ``browser``) are built when missing or stale; an
        environment built with ``farm image build NAME`` is rebuilt from the spec its image
        recorded when the kernel changed since. Any other name must be an image already
        (``farm-sandbox:NAME``, or the reference itself): farm cannot guess its contents, and
        says so (``SandboxUnavailable``). The worker gets what was resolved (its build, and the
        spec whose sandbox limits it takes where no ``FARM_SANDBOX_*`` setting says otherwise).
        A live worker of ours that serves ``image`` but is not registered (starting, or the
        broker lost its registration) is waited for instead: concurrent callers and a broker
        restart must not multiply workers.
        """
        name = ImageName.parse(image)
        with self._serving:
            running = [
                w
                for w, served in self.worker_images.items()
                if served == name.asked and self.workers[w].poll() is None
            ]
            if running:
                self.wait_ready(running[:1])
                return running[0]
            worker_id = self.add_worker(self._prepare(name))
            self.wait_ready([worker_id])
            return worker_id

    def _prepare(self, name: ImageName) -> ImageName | ServedImage:
        """``name`` made ready and resolved for workers of the docker backend (``prepare``),
        for the farm's first workers as for those started on demand."""
        if self.backend == "process":
            return name
        from farm.sandbox.catalog import prepare
        from farm.sandbox.images import connect

        log.info("preparing %s for a worker (built if missing or stale)", name.tag)
        if self._docker is None:  # one client, its API version asked once (~10 ms a time)
            self._docker = connect()
        return prepare(name, self._docker)

    def kill_worker(self, worker_id: str, sig: int = signal.SIGKILL) -> None:
        self.workers[worker_id].send_signal(sig)

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.terminate()
        for worker_id, proc in self.workers.items():
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("worker %s did not stop in time; killing it", worker_id)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)
        if self.backend != "process":
            self._remove_containers()
        if self._bundling is not None:
            self._bundling.join(STOP_TIMEOUT_S)  # before its directory goes
        client, self._docker = self._docker, None
        if client is not None:
            client.close()
        self.redis.stop()  # an ephemeral broker: nothing to save
        shutil.rmtree(self.dir, ignore_errors=True)

    def _remove_containers(self) -> None:
        """Remove what the workers' sandboxes left, with the farm's Docker client if it has
        one (its API version already agreed), else a client of its own."""
        try:
            import docker.errors

            from farm.sandbox.images import client_from_env

            client = self._docker or client_from_env()
        except Exception:
            return
        with contextlib.nullcontext() if client is self._docker else contextlib.closing(client):
            for worker_id in list(self.workers):  # the supervisor thread may still add one
                for container in client.containers.list(
                    ignore_removed=True, all=True, filters={"label": f"farm.owner={worker_id}"}
                ):
                    with contextlib.suppress(docker.errors.NotFound):  # its worker removed it
                        container.remove(force=True)

    def __enter__(self) -> LocalFarm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
