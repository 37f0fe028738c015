"""``FarmSettings``: every setting of farm in one place, read from ``FARM_*`` variables.

Nothing else in farm reads ``os.environ`` (the kernel, being stdlib-only, reads its own two).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SandboxLimits(BaseSettings):
    """Hardening and resource limits of a docker sandbox; each can be changed, all are on."""

    model_config = SettingsConfigDict(env_prefix="FARM_SANDBOX_", extra="ignore")

    memory_mb: int = Field(512, ge=64, description="--memory and --memory-swap")
    cpus: float = Field(1.0, gt=0, description="--cpus")
    pids: int = Field(128, ge=16, description="--pids-limit")
    nofile: int = Field(1024, ge=64, description="ulimit nofile")
    fsize_mb: int = Field(256, ge=1, description="ulimit fsize: largest file a process writes")
    tmp_mb: int = Field(64, ge=1, description="size of the /tmp tmpfs")
    workspace_mb: int = Field(256, ge=1, description="size of the /workspace tmpfs")
    network: str = Field("none", description="docker network mode; 'none' = no network at all")
    read_only: bool = True
    user: str = "10001:10001"
    runtime: str | None = Field(None, description="e.g. 'runsc' for gVisor")
    grace_s: float = Field(2.0, gt=0, description="interrupt-to-kill grace period of the kernel")


class FarmSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FARM_", extra="ignore")

    broker_url: str = "redis://127.0.0.1:6379/0"
    backend: str = Field("docker", description="sandbox backend: docker, process or auto")
    image: str = Field("farm-sandbox:default", description="sandbox image of this worker")
    socket_dir: Path = Field(
        Path("/tmp/farm-sockets"), description="host dir holding each sandbox's socket dir"
    )
    sandbox_start_timeout_s: float = 30.0
    watchdog_interval_s: float = 1.0
    metrics_port: int = 0
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
