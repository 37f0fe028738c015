"""One exec in flight (``Call``), and what a session's helpers need of the session sending it.

``farm.client.stream`` and ``farm.client.journal_replay`` drive a session's calls through ``Caller``
(``Session`` is one), and ``farm.client.session_files`` its file operations through ``FileChannel``:
typed against these, they import nothing of ``farm.client.session``, which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from farm.client.broker import Watch

if TYPE_CHECKING:
    from farm.client.broker import Broker
    from farm.client.hostcall_handlers import Callbacks
    from farm.events.journal import Journal
    from farm.models import ExecRequest, ExecResult, FileOperation, RestoreReport


@dataclass
class Call:
    """One exec in flight: its task, request, deadline and what to watch while waiting
    (``Session.send`` makes it, ``Session.collect`` waits for it)."""

    pending: Any
    request: ExecRequest
    deadline: float
    watch: Watch


class CallerFarm(Protocol):
    """What a session's helpers use of its farm: the broker and the journal."""

    @property
    def broker(self) -> Broker: ...

    @property
    def journal(self) -> Journal: ...


class Placed(Protocol):
    """A session as its helpers find it: its farm, its id, its worker."""

    @property
    def farm(self) -> CallerFarm: ...

    @property
    def id(self) -> str: ...

    @property
    def worker(self) -> str: ...


class Caller(Placed, Protocol):
    """A session as its stream and its restore see it: the three steps of a call (send,
    collect, settle), the epoch it accepts, and where its events and callbacks are."""

    @property
    def epoch(self) -> int: ...

    @property
    def callbacks(self) -> Callbacks | None: ...

    @property
    def restores(self) -> list[RestoreReport]: ...

    def send(
        self,
        code: str,
        timeout_s: float | None,
        *,
        max_output_bytes: int | None = None,
        exec_id: str | None = None,
        stream: bool = False,
        replay_of: str | None = None,
    ) -> Call: ...

    def collect(self, call: Call) -> ExecResult: ...

    def settle(
        self, result: ExecResult, code: str, timeout_s: float | None, **kwargs: Any
    ) -> ExecResult: ...

    def restart(self) -> None: ...


class FileChannel(Protocol):
    """A session as its files see it: one chunk of a file operation, sent and answered; the
    chunk's bytes (``blob``) go and come back raw (``farm.stores.parcels``), a read's in the
    reply's ``blob``."""

    def file_operation(
        self, operation: FileOperation, blob: bytes | None = None
    ) -> dict[str, Any]: ...
