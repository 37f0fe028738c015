"""``FarmSettings``: every setting of farm in one place, read from ``FARM_*`` variables.

Nothing else in farm reads ``os.environ`` (the kernel, being stdlib-only, reads its own two).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from farm.errors import InvalidRequest
from farm.image_name import ImageName, ServedImage


class SandboxLimits(BaseSettings):
    """Hardening and resource limits of a docker sandbox; each can be changed, all are on."""

    model_config = SettingsConfigDict(env_prefix="FARM_SANDBOX_", extra="ignore")

    memory_mb: int = Field(default=512, ge=64, description="--memory and --memory-swap")
    cpus: float = Field(default=1.0, gt=0, description="--cpus")
    pids: int = Field(
        default=4096,
        ge=64,
        description="--pids-limit: every live box's pids plus the kernel's reserve must fit "
        "(the kernel refuses a box that would not): 32 sessions of 64 and spares by default",
    )
    nofile: int = Field(default=1024, ge=64, description="ulimit nofile")
    fsize_mb: int = Field(
        default=256, ge=1, description="ulimit fsize: largest file a process writes"
    )
    tmp_mb: int = Field(default=64, ge=1, description="size of the /tmp tmpfs")
    workspace_mb: int = Field(default=256, ge=1, description="size of the /workspace tmpfs")
    disk_mb: int = Field(
        default=6144,
        ge=16,
        description="room for the boxes' private disks together (tmpfs: added to --memory, "
        "since their pages live there; the kernel refuses a box that would not fit)",
    )
    apparmor_profile: str | None = Field(
        default=None,
        description="an AppArmor profile for the sandbox (deploy/apparmor/farm-sandbox)",
    )
    seccomp_profile: Path | None = Field(
        default=None,
        description="a seccomp profile (JSON file) for the sandbox instead of Docker's own",
    )
    isolation: Literal["namespaces", "uids"] = Field(
        default="namespaces",
        description="what a box is: a uid plus namespaces, or only a uid (what a host that "
        "forbids namespaces falls back to; here by choice, e.g. to compare them)",
    )
    require_namespaces: bool = Field(
        default=False,
        validation_alias=AliasChoices("FARM_REQUIRE_NAMESPACES", "require_namespaces"),
        description="refuse to start a sandbox whose boxes cannot have namespaces "
        "(instead of falling back to uid boxes, loudly)",
    )
    network: str = Field(
        default="none", description="docker network mode; 'none' = no network at all"
    )
    read_only: bool = True
    runtime: str | None = Field(default=None, description="e.g. 'runsc' for gVisor")
    grace_s: float = Field(
        default=2.0, gt=0, description="interrupt-to-kill grace period of the kernel"
    )


class BoxSettings(BaseSettings):
    """Default limits of each session's box (a uid of its own in a docker sandbox): a session or
    sweep item may ask for others (``limits=``) within its sandbox's caps (``SandboxLimits``).
    They keep one session from starving its neighbours in the same sandbox."""

    model_config = SettingsConfigDict(env_prefix="FARM_BOX_", extra="ignore")

    memory_mb: int = Field(
        default=256,
        ge=16,
        description="data of each process (RLIMIT_DATA): more raises MemoryError",
    )
    pids: int = Field(default=64, ge=4, description="processes and threads of a box (RLIMIT_NPROC)")
    fsize_mb: int | None = Field(
        default=None, ge=1, description="largest file (default: the sandbox's)"
    )
    nofile: int = Field(default=512, ge=16, description="open files of each process")
    disk_mb: int | None = Field(
        default=None,
        ge=1,
        description="the box's private /workspace, /tmp, /var/tmp and /dev/shm together, MB "
        "(default: the kernel's, 128 or a quarter of the sandbox's disk_mb)",
    )


class EgressSettings(BaseSettings):
    """What boxes may reach (docs/design/egress.md): nothing unless the operator sets a ceiling.
    Lists are comma-separated (or JSON) in the environment."""

    model_config = SettingsConfigDict(env_prefix="FARM_EGRESS_", extra="ignore")

    allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="the ceiling: host patterns any box may be allowed ('api.example.com', "
        "'*.example.org:443', '*'); empty: no egress for anyone",
    )
    allow_private: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="address ranges (CIDR) a box may reach although not public; everything "
        "private, loopback, link-local (cloud metadata) is refused otherwise",
    )
    ca_bundle: Path | None = Field(
        default=None,
        description="a CA bundle (PEM) on the host, mounted read-only into sandboxes and named "
        "by SSL_CERT_FILE, REQUESTS_CA_BUNDLE, PIP_CERT, ... in boxes with egress",
    )
    max_bytes: int = Field(default=256 << 20, ge=1, description="bytes each way, per box")
    max_connections: int = Field(default=32, ge=1, description="connections open at once a box")
    connection_s: float = Field(default=600.0, gt=0, description="longest connection, seconds")

    @field_validator("ca_bundle", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value  # an empty variable (compose passes them on)

    @field_validator("allow", "allow_private", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value


# Limits that differ by image, applied where no FARM_SANDBOX_* (or FARM_BOX_*) variable says
# otherwise. The browser runs Chromium and Playwright's node driver in the sandbox: about
# 300-600 MiB and a hundred threads for a few pages, Chromium's shared memory in /tmp
# (--disable-dev-shm-usage). The default image keeps the defaults above.
IMAGE_LIMITS: dict[str, dict[str, Any]] = {
    "browser": {"memory_mb": 2048, "tmp_mb": 512, "nofile": 4096},
    "docs": {"memory_mb": 1024},
    "judge": {"memory_mb": 3072, "cpus": 2.0},  # compilers and tests of many items at once
    # Inspect AI's samples: each that uses Inspect's injected tools keeps ~32 MiB of them in
    # /var/tmp and ~33 MiB in their server: room for eight at once (docs/integrations.md).
    "inspect": {"memory_mb": 1024, "tmp_mb": 272},
}
IMAGE_BOX_LIMITS: dict[str, dict[str, Any]] = {
    "browser": {"memory_mb": 1536, "pids": 256, "nofile": 2048, "disk_mb": 256},
    "docs": {"memory_mb": 768},
    "judge": {"pids": 96},  # a JVM's threads count (RLIMIT_NPROC); 32 boxes fit 4096 pids
}


class FarmSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FARM_", extra="ignore")

    broker_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="redis:// or rediss:// (TLS); may hold the password",
    )
    broker_password: SecretStr | None = Field(
        default=None,
        description="the broker's password when broker_url holds none (a Secret, an env file)",
    )
    broker_tls_ca_file: Path | None = Field(
        default=None,
        description="CA bundle that signed a rediss:// broker's certificate (default: system)",
    )
    broker_tls_cert_file: Path | None = Field(
        default=None,
        description="client certificate for a broker that asks for one (with its key file)",
    )
    broker_tls_key_file: Path | None = None
    backend: str = Field(default="docker", description="sandbox backend: docker, process or auto")
    image: str = Field(
        default="default", description="short name of the sandbox image a worker serves"
    )
    sandbox_image: str | None = Field(
        default=None, description="docker image (default farm-sandbox:IMAGE)"
    )
    served_image: Annotated[ServedImage | None, NoDecode] = Field(
        default=None,
        description="the image a local farm prepared for this worker (JSON; the farm sets it)",
    )
    socket_dir: Path = Field(
        default=Path("/tmp/farm-sockets"), description="host dir holding each sandbox's socket dir"
    )
    sandbox_start_timeout_s: float = 30.0
    watchdog_interval_s: float = 1.0
    metrics_port: int = Field(
        default=0, description="worker metrics/health HTTP port (0: any free)"
    )
    metrics_host: str = "127.0.0.1"
    worker_id: str | None = Field(default=None, description="stable worker id (default: host-pid)")
    concurrency: int | None = Field(
        default=None,
        ge=1,
        description="calls a worker runs at once (threads; default max_sessions + 16, so that "
        "every session can have a call waiting, 8 opens wait for room and others still get "
        "through)",
    )
    max_sessions: int = Field(
        default=32,
        ge=1,
        description="sessions one worker holds at most (within the boxes its sandbox holds; "
        "map items take the rest)",
    )
    judge_parallel: int | None = Field(
        default=None,
        ge=1,
        description="judge items a worker runs at once (default: twice its sandbox's CPUs, "
        "so that tests are timed on a core of their own, not a slice of one)",
    )
    idle_timeout_s: float = Field(
        default=1800.0, gt=0, description="idle sessions expire after this"
    )
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    heartbeat_ttl_s: float = Field(
        default=3.0, gt=0, description="a silent worker is dead after this"
    )
    open_wait_s: float = Field(
        default=30.0, gt=0, description="how long opening waits for capacity"
    )
    broker_wait_s: float = Field(
        default=30.0, ge=0, description="how long a call waits out a broker outage before failing"
    )
    state_file: Path = Field(
        default=Path.home() / ".farm" / "local.json", description="where `farm up` records its farm"
    )
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    box: BoxSettings = Field(default_factory=BoxSettings)
    egress: EgressSettings = Field(default_factory=EgressSettings)
    journal_max_events: int = Field(
        default=10000, ge=10, description="events a session's journal keeps (oldest trimmed first)"
    )
    journal_ttl_s: float = Field(
        default=24 * 3600.0, gt=0, description="a session's journal expires this long after its end"
    )
    snapshot_ttl_s: float = Field(
        default=24 * 3600.0, gt=0, description="how long the farm keeps a kept or paused snapshot"
    )
    snapshot_max_bytes: int = Field(
        default=256 << 20,
        ge=1 << 20,
        description="the largest session snapshot (variables and workspace files), in bytes",
    )
    drain_on_stop: bool = Field(
        default=True, description="a stopping worker moves its sessions to others first"
    )
    journal_exec_max_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=64 * 1024,
        description="bytes one run may add to its journal; past it outputs keep only their text",
    )
    api_token: SecretStr | None = Field(
        default=None, description="`farm serve`: an admin bearer token of the API (never printed)"
    )
    serve_state_file: Path = Field(
        default=Path.home() / ".farm" / "serve.json",
        description="where `farm serve` records its address and first token (0600)",
    )
    api_max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="largest JSON body (and map line) the API reads",
    )
    api_token_concurrency: int = Field(
        default=32,
        ge=1,
        description="calls a new API token may have running at once (its default cap)",
    )
    api_threads: int = Field(
        default=512,
        ge=8,
        description="calls into the farm `farm serve` runs at once, each on a thread: a map "
        "holds one while it runs, an open one while it waits for room (asyncio's default, "
        "cores + 4, would let a handful of clients stall every other)",
    )
    judge0_ttl_s: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="a /judge0 submission is kept this long in the broker's Redis (Judge0 "
        "keeps them for good: farm bounds the storage)",
    )
    judge0_parallel: int = Field(
        default=32,
        ge=1,
        description="queued /judge0 submissions (or batches) one `farm serve` judges at once",
    )
    judge0_callbacks: bool = Field(
        default=True,
        description="whether /judge0 takes a callback_url: farm serve then makes requests "
        "to any address a token names (keep it off where that reaches what it must not)",
    )
    event_stream_max_events: int = Field(
        default=10000, ge=10, description="events one streamed run keeps"
    )
    event_stream_ttl_s: float = Field(
        default=600.0, gt=0, description="a streamed run's events expire"
    )

    @property
    def redis_url(self) -> str:
        """The URL every Redis client of farm connects with: ``broker_url``, with
        ``broker_password`` in it when the URL holds none (a password written in the URL wins:
        a local farm's workers inherit the caller's environment). Never print it."""
        if self.broker_password is None:
            return self.broker_url
        parts = urlsplit(self.broker_url)
        if parts.password is not None:
            return self.broker_url
        user, _, host = parts.netloc.rpartition("@")
        password = quote(self.broker_password.get_secret_value(), safe="")
        return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))

    @property
    def redis_tls(self) -> dict[str, Any] | None:
        """redis-py's ``ssl_*`` options for a ``rediss://`` broker, ``None`` for ``redis://``.

        Celery's transport and result backend and the registry all connect with these, so all
        of them verify the broker's certificate and host name (kombu alone would not: a bare
        ``rediss://`` URL means no verification there). TLS files with a ``redis://`` URL are
        refused rather than silently ignored: the operator asked for TLS.
        """
        files = {
            "ssl_ca_certs": self.broker_tls_ca_file,
            "ssl_certfile": self.broker_tls_cert_file,
            "ssl_keyfile": self.broker_tls_key_file,
        }
        if urlsplit(self.broker_url).scheme != "rediss":
            if any(files.values()):
                raise InvalidRequest(
                    "FARM_BROKER_TLS_* files are set but the broker URL is not rediss://"
                )
            return None
        options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_check_hostname": True}
        options.update({key: str(path) for key, path in files.items() if path is not None})
        return options

    @property
    def worker_name(self) -> str:
        """This process's worker id: ``FARM_WORKER_ID``, else host-pid."""
        return self.worker_id or f"{socket.gethostname()}-{os.getpid()}"

    @property
    def worker_threads(self) -> int:
        return self.concurrency or self.max_sessions + 16

    @field_validator("image")
    @classmethod
    def _image_name(cls, image: str) -> str:
        """A bad ``FARM_IMAGE`` stops the worker at its start (``ImageName``), not at its
        first sandbox."""
        return ImageName(image).asked

    @field_validator("served_image", mode="before")
    @classmethod
    def _served_image(cls, served: Any) -> Any:
        if isinstance(served, str):  # an empty variable (compose passes them on) is unset
            return ServedImage.from_json(served) if served else None
        return served

    @model_validator(mode="after")
    def _image_limits(self) -> FarmSettings:
        """Give the served image its own limits unless explicitly set: those its spec asks for
        (an image a local farm prepared), then IMAGE_LIMITS (and IMAGE_BOX_LIMITS)."""
        served = self.served_image
        if served is not None and served.name.asked != self.image:
            raise InvalidRequest(f"FARM_SERVED_IMAGE is {served.name}, FARM_IMAGE {self.image}")
        spec_limits = ((served.spec if served else None) or {}).get("limits") or {}
        for wanted in (spec_limits, IMAGE_LIMITS.get(self.image, {})):
            update = {
                k: v
                for k, v in wanted.items()
                if v is not None and k not in self.limits.model_fields_set
            }
            if update:  # checked as the FARM_SANDBOX_* variables would be
                checked = SandboxLimits(**update).model_dump(include=set(update))
                self.limits = self.limits.model_copy(update=checked)
        wanted = IMAGE_BOX_LIMITS.get(self.image, {})
        update = {k: v for k, v in wanted.items() if k not in self.box.model_fields_set}
        if update:
            self.box = self.box.model_copy(update=update)
        return self
