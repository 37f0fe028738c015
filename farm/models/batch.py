"""Batch work: an item of ``Farm.map`` or a sweep line, its record, and what travels between the
client and the workers for it (chunks of items out, one ``ItemDone`` per item back)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from farm.models.base import Model
from farm.models.results import BoxLimits, ExecResult


class BatchItem(Model):
    """One item: a ``code`` string, or ``cells`` run in order in one session (stopping at the
    first failure), with an optional ``setup`` cell first, ``files`` written to the workspace
    before, its own ``timeout_s`` and box ``limits``."""

    id: str | int
    code: str | None = None
    cells: list[str] | None = None
    setup: str | None = None
    timeout_s: float | None = Field(None, gt=0)
    files: dict[str, str] | None = Field(None, description="workspace path -> text content")
    limits: BoxLimits | None = None

    @model_validator(mode="after")
    def _one_body(self) -> BatchItem:
        if (self.code is None) == (self.cells is None):
            raise ValueError("give exactly one of 'code' or 'cells'")
        return self

    def all_cells(self) -> list[str]:
        body = self.cells if self.cells is not None else [self.code or ""]
        return ([self.setup] if self.setup else []) + body


class BatchRecord(Model):
    """The outcome of one item: a ``farm sweep`` output line, what ``Farm.map`` yields."""

    id: str | int
    status: str  # ok | error
    kind: str | None = None
    message: str | None = None
    cells: list[ExecResult] = Field(default_factory=list)
    attempts: int = 0
    duration_s: float = 0.0
    cached: bool = False
    manifest: dict[str, Any] = Field(default_factory=dict)
    journal: list[dict[str, Any]] | None = Field(
        None, description="with journal=True: the item's session journal as mime_stream dicts"
    )

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class ChunkItem(Model):
    """One attempt at one item, as a worker runs it (``key``: its place in the map)."""

    key: int
    exec_id: str = Field(description="claimed before the item runs: a copy never runs twice")
    cells: list[str]
    files: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(gt=0)
    limits: dict[str, int] = Field(default_factory=dict)


class Chunk(Model):
    """The payload of one ``farm.batch`` task: items a worker runs at once, each in a box of
    its own, publishing each result to ``results`` (a Redis list) as soon as it ends."""

    map_id: str
    chunk_id: str = Field(description="claimed by the worker that takes the chunk")
    results: str = Field(description="the Redis list the client reads the results from")
    items: list[ChunkItem]
    journal: bool = False


class ItemDone(Model):
    """What a worker publishes when one item ends."""

    key: int
    exec_id: str
    worker: str
    session_id: str = ""
    cells: list[ExecResult] = Field(default_factory=list)
