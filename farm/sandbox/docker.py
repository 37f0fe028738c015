"""The ``docker`` backend: one hardened container running the kernel, a box per session.

Invariants: no network (``--network none``), the kernel's socket in a root-only host directory,
a read-only root with capped tmpfs, resource limits from ``SandboxLimits``; the kernel holds
five capabilities (``BOX_CAPS``) and no user code runs as root or with any; each sandbox gets
its own block of box uids; everything created carries ``farm.managed``/``farm.owner`` labels,
so ``remove_orphans`` finds what a dead owner left. The defaults and their reasons:
docs/design/docker-sandbox.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Ulimit

from farm.errors import SandboxStartError
from farm.image_name import ImageName, ServedImage
from farm.kernel.wire import auth
from farm.kernel.wire.client import KernelClient, KernelError
from farm.local.processes import pid_alive
from farm.models import Preloaded, SandboxHealth, SandboxInfo, frames
from farm.sandbox.backend import KERNEL_ENV, Sandbox, box_arguments
from farm.sandbox.bundle import MOUNT as BUNDLE
from farm.sandbox.bundle import kernel_bundle
from farm.sandbox.images import client_from_env
from farm.sandbox.served import missing, serve
from farm.settings import BoxSettings, SandboxLimits

log = logging.getLogger(__name__)

LABEL_MANAGED = "farm.managed"
LABEL_OWNER = "farm.owner"
LABEL_HOST = "farm.host"
LABEL_PID = "farm.pid"
LABEL_UID_BASE = "farm.uid_base"
CA_MOUNT = "/etc/farm/egress-ca.pem"  # where boxes with egress find the operator's CA bundle
MOUNT = "/run/farm"
BOX_CAPS = ["CHOWN", "SETUID", "SETGID", "SETPCAP", "KILL"]
# Making a box's namespaces, disk and loopback: held by the kernel's zygote alone (the
# supervisor drops them at start, each box's pid 1 after making the box; no box holds any).
NAMESPACE_CAPS = ["SYS_ADMIN", "NET_ADMIN"]
# Box uids: a block of UID_BLOCK per sandbox, at UID_FIRST + k * UID_BLOCK for a k no other live
# sandbox of this engine holds (and random, so that engines sharing a host rarely meet).
UID_FIRST = 100_000
UID_BLOCK = 1024
UID_BLOCKS = 4000


class DockerSandbox(Sandbox):
    def __init__(
        self,
        image: ServedImage | str | None = None,
        *,
        owner: str | None = None,
        limits: SandboxLimits | None = None,
        box: BoxSettings | None = None,
        socket_dir: Path = Path("/tmp/farm-sockets"),
        start_timeout_s: float = 30.0,
        client: docker.DockerClient | None = None,
        ca_bundle: Path | None = None,
    ) -> None:
        # a resolved image runs as it is; a reference (default: the build of this checkout's
        # kernel) is resolved at the start (``farm.sandbox.served``)
        self.served = image if isinstance(image, ServedImage) else None
        self.image = image.tag if isinstance(image, ServedImage) else image or ""
        self.owner = owner or f"local-{os.getpid()}"
        self.limits = limits or SandboxLimits()
        self.box = box
        self.ca_bundle = ca_bundle  # the host's CA bundle for boxes with egress (read-only)
        self.start_timeout_s = start_timeout_s
        self.id = uuid.uuid4().hex[:12]
        self.dir = socket_dir / self.id
        self.address = f"unix:{self.dir / 'kernel.sock'}"
        self._token = auth.new_token()
        self._client = client
        self._own_client: docker.DockerClient | None = None
        self.container: Container | None = None
        self.kernel_version: str | None = None
        self.isolation: str | None = None  # the kernel's word, at its first answer
        self.isolation_fallback: str | None = None
        self.preload: Preloaded | None = None  # what its kernel preloaded (its first pong)

    @property
    def token(self) -> str:
        return self._token

    @property
    def docker(self) -> docker.DockerClient:
        if self._client is None:
            self._client = self._own_client = client_from_env()
        return self._client

    def _prepare_dir(self) -> None:
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700)
        token_file = self.dir / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._token)
        if os.geteuid() != 0:
            # The container's root (without CAP_DAC_OVERRIDE) cannot enter a directory of
            # ours: open it up. The token still guards the socket, and the kernel deletes the
            # token file before any session exists.
            log.warning("not root: making the socket directory %s world-writable", self.dir)
            os.chmod(self.dir, 0o777)
            os.chmod(token_file, 0o644)

    def _uid_base(self) -> int:
        """A block of box uids no other live sandbox of this engine uses."""
        taken = set()
        for container in self.docker.containers.list(  # sparse: labels without an inspect each
            ignore_removed=True, sparse=True, filters={"label": LABEL_UID_BASE}
        ):
            with contextlib.suppress(ValueError):
                taken.add(int((container.attrs.get("Labels") or {})[LABEL_UID_BASE]))
        free = [UID_FIRST + k * UID_BLOCK for k in range(UID_BLOCKS)]
        return random.choice([base for base in free if base not in taken])

    def _run_kwargs(self, uid_base: int) -> dict[str, Any]:
        lim = self.limits
        mb = 1024 * 1024
        disk_mb = lim.disk_mb if lim.isolation == "namespaces" else 0  # uid boxes have none
        kwargs: dict[str, Any] = {
            "name": f"farm-sandbox-{self.id}",
            "detach": True,
            "labels": {
                LABEL_MANAGED: "1",
                LABEL_OWNER: self.owner,
                LABEL_HOST: socket.gethostname(),
                LABEL_PID: str(os.getpid()),
                LABEL_UID_BASE: str(uid_base),
            },
            "network_mode": lim.network,
            "user": "0:0",
            "read_only": lim.read_only,
            "cap_drop": ["ALL"],
            "cap_add": BOX_CAPS + (NAMESPACE_CAPS if lim.isolation == "namespaces" else []),
            "security_opt": ["no-new-privileges"],
            # exec: a compiled program runs where it was built (noexec, Docker's default for a
            # tmpfs, would stop no code that Python itself can run)
            "tmpfs": {
                "/tmp": f"size={lim.tmp_mb}m,mode=1733,exec,nosuid,nodev",
                "/var/tmp": f"size={lim.tmp_mb}m,mode=1733,exec,nosuid,nodev",
                "/workspace": f"size={lim.workspace_mb}m,mode=0711,exec,nosuid,nodev",
            },
            "pids_limit": lim.pids,
            # the boxes' disks are tmpfs: their pages are the sandbox's memory too
            "mem_limit": (lim.memory_mb + disk_mb) * mb,
            "memswap_limit": (lim.memory_mb + disk_mb) * mb,
            "nano_cpus": int(lim.cpus * 1e9),
            "ulimits": [
                Ulimit(name="nofile", soft=lim.nofile, hard=lim.nofile),
                Ulimit(name="fsize", soft=lim.fsize_mb * mb, hard=lim.fsize_mb * mb),
                Ulimit(name="core", soft=0, hard=0),
            ],
            "init": True,
            "environment": dict(KERNEL_ENV),
            "volumes": {str(self.dir): {"bind": MOUNT, "mode": "rw"}},
            "command": [
                "--unix",
                f"{MOUNT}/kernel.sock",
                "--token-file",
                f"{MOUNT}/token",
                "--grace-s",
                str(lim.grace_s),
                "--isolation",
                lim.isolation,
                *(["--require-namespaces"] if lim.require_namespaces else []),
                *(["--disk-mb", str(disk_mb)] if disk_mb else []),
                "--workspace",
                "/workspace",
                "--tmp-root",
                "/tmp",
                "--box-uid-base",
                str(uid_base),
                *box_arguments(self.box),
                *(["--egress-ca", CA_MOUNT] if self.ca_bundle else []),
            ],
        }
        if self.ca_bundle:
            kwargs["volumes"][str(self.ca_bundle)] = {"bind": CA_MOUNT, "mode": "ro"}
        if lim.runtime:
            kwargs["runtime"] = lim.runtime
        if lim.apparmor_profile:
            kwargs["security_opt"].append(f"apparmor={lim.apparmor_profile}")
        if lim.seccomp_profile is not None:  # Docker takes the profile itself, not its path
            kwargs["security_opt"].append(f"seccomp={lim.seccomp_profile.read_text()}")
        return kwargs

    def start(self, launched: Callable[[], None] | None = None) -> None:
        try:
            self._prepare_dir()
            served = self._resolve()
            kwargs = self._run_kwargs(self._uid_base())
            if not served.kernel_built_in:
                self._mount_kernel(kwargs)  # any image with python3: bring the kernel
            self.container = self.docker.containers.create(served.image_id, **kwargs)
            if launched is not None:
                launched()
            self.container.start()
            self._wait_ready()
        except docker.errors.ImageNotFound as exc:  # removed since it was resolved
            self.stop()
            raise missing(self.image) from exc
        except docker.errors.DockerException as exc:
            self.stop()
            raise SandboxStartError(f"docker could not start the sandbox: {exc}") from exc
        except BaseException:
            self.stop()
            raise
        self.started_at = time.time()
        if self.isolation_fallback:
            log.error(
                "sandbox %s: BOXES HAVE NO NAMESPACES (%s): sessions share its loopback "
                "network, disk and process table; load farm's AppArmor profile or set "
                "FARM_REQUIRE_NAMESPACES=1 to refuse (README, Security model)",
                self.id,
                self.isolation_fallback,
            )
        log.info(
            "sandbox %s started (container %s, owner %s)",
            self.id,
            self.container.short_id,
            self.owner,
        )

    def _resolve(self) -> ServedImage:
        """The build this sandbox runs: the one it was given, else what its reference names
        now (once: a sandbox never changes its image)."""
        if self.served is None:
            name = ImageName(self.image) if self.image else ImageName()
            self.served = serve(name, self.image or None, self.docker)
            self.image = self.served.tag
        return self.served

    def _mount_kernel(self, kwargs: dict[str, Any]) -> None:
        """Run an image without farm's kernel: the kernel bundle read-only at ``/opt/farm``,
        started with the image's own ``python3`` (whatever its entrypoint and user)."""
        kwargs["volumes"][str(kernel_bundle(self.dir.parent))] = {"bind": BUNDLE, "mode": "ro"}
        kwargs["entrypoint"] = ["python3", "-m", "farm.kernel"]
        kwargs["working_dir"] = "/workspace"
        kwargs["environment"] |= {
            "PYTHONPATH": BUNDLE,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def _wait_ready(self) -> None:
        assert self.container is not None
        deadline = time.monotonic() + self.start_timeout_s
        last = "no socket yet"
        polls = 0
        while time.monotonic() < deadline:  # the socket every 2 ms (a stat), Docker every 0.1 s
            if (self.dir / "kernel.sock").exists():
                try:
                    with KernelClient.at(
                        self.address, self._token, connect_timeout_s=2, check=frames.validate
                    ) as c:
                        pong = c.ping()
                    self.kernel_version = pong["version"]
                    self.isolation = pong.get("isolation")
                    self.isolation_fallback = pong.get("isolation_fallback")
                    self.preload = Preloaded.model_validate(pong["preload"])
                    return
                except KernelError as exc:
                    last = str(exc)
            polls += 1
            if polls % 50 == 0:  # Docker's view, a call to the daemon: a fiftieth as often
                self.container.reload()
                if self.container.status in ("exited", "dead"):
                    logs = self.container.logs(tail=20).decode(errors="replace")
                    raise SandboxStartError(f"the sandbox container exited at start:\n{logs}")
            time.sleep(0.002)  # poll interval of the readiness check above
        raise SandboxStartError(f"the sandbox kernel did not answer in time ({last})")

    def stop(self) -> None:
        container, self.container = self.container, None
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.DockerException as exc:
                log.warning("could not remove sandbox container %s: %s", container.short_id, exc)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._own_client is not None:  # the client this sandbox opened (not one it was given)
            self._own_client.close()
            self._own_client = self._client = None

    def container_state(self) -> dict[str, Any]:
        """Docker's view: ``Status``, ``OOMKilled``, ``ExitCode``... ({} when gone)."""
        if self.container is None:
            return {}
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return {"Status": "removed"}
        return dict(self.container.attrs.get("State", {}))

    def health(self, timeout_s: float = 3.0) -> SandboxHealth:
        health = super().health(timeout_s)
        if health.ok:
            return health
        state = self.container_state()
        detail = health.detail
        if state:
            detail = (
                f"container {state.get('Status')}, oom_killed={state.get('OOMKilled')}, "
                f"exit={state.get('ExitCode')}: {detail}"
            )
        return SandboxHealth(ok=False, detail=detail)

    def info(self) -> SandboxInfo:
        """What runs: the build it was resolved to (no Docker call: heartbeats call this every
        second)."""
        served = self.served
        return SandboxInfo(
            backend="docker",
            isolated=True,
            address=self.address,
            container_id=self.container.id if self.container else None,
            image=self.image,
            image_digest=served.digest if served else None,
            image_spec=served.spec if served else None,
            limits=self.limits.model_dump(),
            kernel_version=self.kernel_version,
            isolation=self.isolation,
            isolation_fallback=self.isolation_fallback,
            preload=self.preload,
            started_at=self.started_at,
        )


def remove_orphans(
    client: docker.DockerClient | None = None, *, live_owners: set[str] | None = None
) -> list[str]:
    """Remove farm containers whose owner is gone; return their names.

    An owner is gone when it is not in ``live_owners`` (when given, e.g. from the worker
    registry), or when it ran on this host and its process no longer exists.
    """
    if client is None:
        with contextlib.closing(client_from_env()) as own:
            return remove_orphans(own, live_owners=live_owners)
    removed = []
    here = socket.gethostname()
    for container in client.containers.list(
        ignore_removed=True, all=True, filters={"label": f"{LABEL_MANAGED}=1"}
    ):
        labels = container.labels
        owner = labels.get(LABEL_OWNER, "")
        if live_owners is not None:
            orphan = owner not in live_owners
        else:
            pid = labels.get(LABEL_PID, "")
            orphan = labels.get(LABEL_HOST) == here and pid.isdigit() and not pid_alive(int(pid))
        if orphan:
            try:
                container.remove(force=True)
                removed.append(str(container.name))
            except docker.errors.NotFound:
                pass
    return removed
