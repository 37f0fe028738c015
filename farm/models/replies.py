"""A session open as it waits for a worker (``OpenRequest``), and the worker's answers:
``Opened``, ``Refused`` (never ask again) or ``Busy`` (ask again, elsewhere). Kernel frames are
not here: they are the kernel's ``TypedDict``s (``farm.kernel.wire.protocol``), checked by
``farm.models.frames``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from farm.models.model_base import Model
from farm.models.snapshot_info import Restored


class OpenRequest(Model):
    """A session open, queued on its image's list of opens (``registry.opens_key``) until a
    worker has room for its box; the answer goes to the list ``reply``. The worker that takes
    it claims ``open_id`` first: an id its client abandoned opens nothing."""

    open_id: str
    reply: str = Field(description="the Redis list of its client's answers (each names its open)")
    tools: bool = True
    limits: dict[str, int] | None = None
    egress: list[str] | None = None
    sent_at: float = Field(description="the client's time.time() as it was queued")
    deadline: float = Field(description="time.time() past which no worker opens it")
    session_id: str | None = Field(default=None, description="its id (a resume or a move)")
    restore: str | None = Field(default=None, description="the kept snapshot it opens with")
    moved: bool = Field(default=False, description="a drain's move: a loss is told once")


class Opened(Model):
    """A worker opened a session (the answer to an ``OpenRequest``)."""

    session_id: str
    epoch: int
    worker: str
    generation: int
    queue: str
    queue_s: float = 0.0  # how long it waited for room: in the list, at the worker, the kernel
    restored: Restored | None = None  # what its snapshot brought, when it opened with one


class Refused(Model):
    """A worker will not open this session anywhere (limits over its sandbox's caps); the
    client raises ``InvalidRequest`` instead of asking again."""

    refused: Literal[True] = True
    worker: str | None = None
    reason: str
    code: str | None = None  # a snapshot's refusal: ``SnapshotError.code``


class Busy(Model):
    """A worker could not take the request now; the client asks again (elsewhere)."""

    busy: Literal[True] = True
    worker: str | None = None
    reason: str
