"""The HTTP API's request and response bodies (results are ``farm.models``' own).

Every request model refuses unknown fields (``farm.models.Model``), so a typo, or an option
this farm does not have (``egress``), is a 422 problem before anything reaches a worker.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from farm.models import BoxLimits, Model


class SessionCreate(Model):
    image: str = Field("default", description="the farm image its worker serves")
    timeout_s: float = Field(30.0, gt=0, le=86400, description="default timeout of its runs")
    open_wait_s: float | None = Field(None, gt=0, le=600, description="wait for room this long")
    tools: bool = Field(True, description="the agent tools (ls, read, grep, apply_patch, bash)")
    limits: BoxLimits | None = Field(None, description="the box's limits (within the sandbox's)")
    egress: list[str] | None = Field(
        None,
        description="hosts its box may reach ('pypi.org', '*.example.org:443'), within "
        "the farm's ceiling",
    )


class SessionInfo(Model):
    id: str
    image: str | None = None
    worker: str | None = None
    epoch: int = 0
    queue_s: float | None = Field(
        None, description="when it was opened: how long it waited for room (a full farm)"
    )


class RunRequest(Model):
    code: str
    timeout_s: float | None = Field(None, gt=0, le=86400)
    max_output_bytes: int | None = Field(None, ge=1)


class SessionRunRequest(RunRequest):
    rollback_to: str | None = Field(
        None, description="a checkpoint of the session to return to (kept) before the run"
    )


class OneShotRequest(RunRequest):
    image: str = "default"
    limits: BoxLimits | None = None
    retries: int = Field(0, ge=0, le=5, description="retries of infrastructure failures")
    egress: list[str] | None = Field(None, description="hosts its box may reach")


class ExecRequest(Model):
    cmd: str | list[str] = Field(description="an argv list (no shell), or a string for sh -c")
    input: str | None = Field(None, description="text for its stdin")
    input_base64: str | None = Field(None, description="bytes for its stdin, base64")
    cwd: str | None = None
    env: dict[str, str] | None = None
    timeout_s: float | None = Field(None, gt=0, le=86400)
    max_output_bytes: int | None = Field(None, ge=1)


class FileEntry(Model):
    path: str
    type: str
    size: int = 0
    mode: int | None = None


class FileWritten(Model):
    path: str
    size: int


class WorkerInfo(Model):
    id: str
    image: str | None = None
    ready: bool = False
    sessions: int = 0
    capacity: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)


class ImageInfo(Model):
    name: str
    workers: int
    capacity: int


class TokenInfo(Model):
    id: str
    name: str
    scopes: list[str]
    concurrency: int
