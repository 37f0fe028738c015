"""A worker's answers to a session open (``worker_requests.OpenRequest``): ``Opened``,
``Refused`` (never ask again) or ``Busy`` (ask again, elsewhere). Kernel frames are not here:
they are the kernel's ``TypedDict``s (``farm.kernel.wire.protocol``), checked by
``farm.models.frames``."""

from __future__ import annotations

from typing import Literal

from farm.models.model_base import Model
from farm.models.snapshot_info import Restored


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
