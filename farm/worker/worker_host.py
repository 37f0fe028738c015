"""What a worker's parts (``SessionCalls``, ``SessionOpens``, ``BatchRunner``) need of the
``Worker`` they act for: ``WorkerHost``, a protocol, so they import nothing of
``worker_state`` and ``Worker`` alone puts them together (as the client's ``MapHost`` and
``Caller`` do); and ``HeldSession``, what a worker knows of a session it holds.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from farm.events.journal import Journal
from farm.kernel.wire.client import KernelClient
from farm.registry import Registry
from farm.sandbox.sandbox_keeper import SandboxKeeper
from farm.settings import FarmSettings
from farm.worker.box_gate import BoxGate, Ticket
from farm.worker.snapshot_calls import SessionSnapshots
from farm.worker.worker_egress import WorkerEgress


@dataclass
class HeldSession:
    sandbox_generation: int
    epoch: int
    last_used: float
    lost: str | None = None
    ticket: Ticket | None = None  # its room at the gate, until it closes or is lost
    notice: str | None = None  # what a move could not carry: its next run says so, once
    one_shot: bool = False  # a one-shot run's: never moved
    limits: dict[str, int] | None = None  # its box's, as asked: a move asks the same
    egress: list[str] | None = None  # the hosts it may reach, as asked: likewise


class WorkerHost(Protocol):
    """The worker as its parts see it: its identity and settings, its registry, journal,
    sandbox, gate and egress, the sessions it holds, and a loan of its kernel."""

    id: str
    settings: FarmSettings
    generation: int
    queue: str
    registry: Registry
    journal: Journal
    keeper: SandboxKeeper
    gate: BoxGate
    egress: WorkerEgress
    sessions: dict[str, HeldSession]
    snapshots: SessionSnapshots

    def kernel(self) -> AbstractContextManager[KernelClient]: ...

    def box_defaults(self) -> dict[str, int]: ...

    def room(self) -> dict[str, Any]: ...

    def hold(self, session_id: str, epoch: int, ticket: Ticket) -> None: ...

    def session_entry(self, session_id: str, epoch: int) -> tuple[str, dict[str, Any], float]: ...

    def close_session(self, session_id: str) -> dict[str, Any]: ...
