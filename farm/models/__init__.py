"""Every wire message and result of farm, described once.

The kernel (stdlib only) emits plain dicts; these models are their schema on the host side, and
a test checks that the two sides agree (``tests/test_protocol.py``). The same models travel to
the caller: ``ExecResult`` is what ``Session.run`` returns. Modules: ``results`` (runs, kinds,
box limits, restores), ``wire`` (kernel frames, worker replies), ``sandboxes`` (what a sandbox
is and how it is doing), ``batch`` (the items and records of ``Farm.map`` and sweeps).
"""

from farm.models.base import Model
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
from farm.models.sandboxes import SandboxHealth, SandboxInfo
from farm.models.wire import (
    KERNEL_FRAMES,
    Answer,
    Auth,
    Busy,
    CallEvent,
    CloseSession,
    DisplayEvent,
    ErrorReply,
    EventFrame,
    ExecReply,
    Execute,
    Hello,
    Opened,
    OpenSession,
    Ping,
    Pong,
    Refused,
    RunningEvent,
    SessionClosed,
    SessionOpened,
    StartedEvent,
    StreamEvent,
    Welcome,
)

__all__ = [
    "KERNEL_FRAMES",
    "Answer",
    "Auth",
    "BoxLimits",
    "Busy",
    "CallAnswer",
    "CallEvent",
    "CommandResult",
    "CloseSession",
    "DisplayEvent",
    "ErrorKind",
    "ErrorReply",
    "EventFrame",
    "ExecError",
    "ExecReply",
    "ExecResult",
    "Execute",
    "Hello",
    "Model",
    "OpenSession",
    "Opened",
    "Ping",
    "Pong",
    "Refused",
    "ReplayedCell",
    "RestoreReport",
    "RunningEvent",
    "SandboxHealth",
    "SandboxInfo",
    "SessionClosed",
    "SessionOpened",
    "StartedEvent",
    "StreamEvent",
    "SubCall",
    "Value",
    "Welcome",
]
