"""farm's results and replies, as callers get them (pydantic models), described once.

The kernel's frames are its own ``TypedDict``s (``farm.kernel.wire.protocol``), which the host
checks with ``frames``; the models here are what callers get: ``ExecResult`` is what
``Session.run`` returns. Modules: ``results`` (runs, kinds, box limits, restores), ``replies``
(a worker's answers to a session open), ``worker_requests`` (what a client asks of a worker,
checked on arrival), ``sandboxes`` (what a sandbox is and how it is doing),
``batch`` (the items and records of ``Farm.map`` and sweeps), ``frames`` (kernel frames).
"""

from farm.models.model_base import Model
from farm.models.replies import Busy, Opened, Refused
from farm.models.results import (
    BoxLimits,
    CallAnswer,
    CommandResult,
    ErrorKind,
    ExecError,
    ExecResult,
    ReplayedCell,
    RestoreReport,
    SubCall,
    Value,
)
from farm.models.sandboxes import BoxCapacity, Preloaded, SandboxHealth, SandboxInfo
from farm.models.worker_requests import (
    BranchRequest,
    CellRequest,
    CloseRequest,
    CommandRequest,
    DrainRequest,
    ExecRequest,
    FileOperation,
    FileRequest,
    Malformed,
    OpenRequest,
    RunRequest,
    SnapshotRequest,
    WorkerRequest,
    arrived,
)

__all__ = [
    "BranchRequest",
    "DrainRequest",
    "SnapshotRequest",
    "BoxLimits",
    "Busy",
    "CallAnswer",
    "CellRequest",
    "CloseRequest",
    "CommandRequest",
    "CommandResult",
    "ErrorKind",
    "ExecError",
    "ExecRequest",
    "ExecResult",
    "FileOperation",
    "FileRequest",
    "Malformed",
    "Model",
    "OpenRequest",
    "Opened",
    "Refused",
    "ReplayedCell",
    "RestoreReport",
    "RunRequest",
    "BoxCapacity",
    "SandboxHealth",
    "Preloaded",
    "SandboxInfo",
    "SubCall",
    "Value",
    "WorkerRequest",
    "arrived",
]
