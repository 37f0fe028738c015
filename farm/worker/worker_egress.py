"""``WorkerEgress``: a worker's side of egress — policies, the proxy, the kernel's endpoints.

A box's policy is decided here, before its box opens (what it asked for, within the farm's
ceiling), and registered under its session id; the kernel then hands the box's endpoint over
the attached connection and the proxy serves it with that policy. An endpoint nobody expects
is closed at once. Every connection ends in an ``Egress`` event (the running cell's record, or
the session's journal), a metric and the session's list of destinations (an item's manifest).
"""

from __future__ import annotations

import collections
import logging
import queue
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from farm.egress.policy import Policy, PolicyError, box_policy
from farm.egress.proxy import EgressProxy, Limits, Record
from farm.events.run_events import Egress
from farm.kernel.wire.framing import FrameError, recv_frame_fds
from farm.worker import metrics

if TYPE_CHECKING:
    from farm.events.journal import Journal
    from farm.sandbox.sandbox_keeper import SandboxKeeper
    from farm.settings import EgressSettings
    from farm.worker.recorder import ExecRecorder

log = logging.getLogger(__name__)

STOP_WAIT_S = 0.5  # a box's connections may take this long to end once its session ends
SETTLE_S = 0.05  # and this long once a run ends, to be in the run's record
EVENTS_KEPT = 1000  # a box's connections past these are counted (metrics), not journaled
DESTINATIONS_KEPT = 256  # distinct (host, port, allowed) a box's manifest lists

__all__ = ["PolicyError", "WorkerEgress"]


@dataclass
class _Expected:
    policy: Policy
    journal: bool = True  # connections outside a recorded run go to the session's journal
    seen: dict[tuple[str, int, bool], dict[str, Any]] = field(default_factory=dict)
    events: int = 0  # connections recorded so far
    recorder: ExecRecorder | None = None  # the run under way in the box, if any

    def saw(self, record: Record) -> None:
        """Count the connection in the box's destinations (what its manifest lists)."""
        key = (record.host, record.port, record.allowed)
        if not record.host or (key not in self.seen and len(self.seen) >= DESTINATIONS_KEPT):
            return
        entry = self.seen.setdefault(
            key, {"host": key[0], "port": key[1], "allowed": key[2], "connections": 0}
        )
        entry["connections"] += 1


class WorkerEgress:
    def __init__(
        self, settings: EgressSettings, keeper: SandboxKeeper, journal: Journal, worker_id: str
    ) -> None:
        self.settings = settings
        self.keeper = keeper  # the sandbox whose kernel hands over the endpoints
        self.journal = journal
        self.worker_id = worker_id
        self.expected: dict[str, _Expected] = {}
        self._lock = threading.Lock()
        self._proxy: EgressProxy | None = None
        self._attached: tuple[int, socket.socket] | None = None  # sandbox generation, channel
        self._records: queue.SimpleQueue[_Ended | None] = queue.SimpleQueue()
        # session id -> records queued, not yet published (``settle`` waits for them)
        self._unpublished: collections.Counter[str] = collections.Counter()
        self._published = threading.Condition()

    def policy(self, asked: Sequence[str] | None) -> Policy | None:
        """The policy of a box that asked for ``asked``, with the hosts its image's spec names
        (``None``: no egress); raises ``PolicyError`` for a rule beyond the farm's ceiling."""
        spec = (self.keeper.info().image_spec or {}) if self.keeper.ready else {}
        wanted = [*(asked or ()), *spec.get("egress", ())]  # the image's own hosts come too
        if not wanted:
            return None
        return box_policy(wanted, self.settings.allow, self.settings.allow_private)

    def expect(self, session_id: str, policy: Policy, journal: bool = True) -> None:
        """Serve the endpoint the kernel will hand over for ``session_id`` with ``policy``
        (call before asking the kernel for the box); ``journal``: whether the session keeps a
        journal (a map item's only when its map asked)."""
        self._attach()
        with self._lock:
            self.expected[session_id] = _Expected(policy, journal)

    def running(self, session_id: str, recorder: ExecRecorder | None) -> None:
        """The run under way in the session's box (its events get the box's connections)."""
        held = self.expected.get(session_id)
        if held is not None:
            held.recorder = recorder

    def settle(self, session_id: str, wait_s: float = SETTLE_S) -> None:
        """As a run in the box ends: the box's connections that are ending (its code has
        read their answers) get ``wait_s`` to end and be published in the run's record."""
        proxy = self._proxy
        if proxy is None or session_id not in self.expected:
            return
        with self._published:
            self._published.wait_for(
                lambda: (
                    not self._unpublished[session_id] and not proxy.open_connections(session_id)
                ),
                timeout=wait_s,
            )

    def forget(self, session_id: str) -> list[dict[str, Any]]:
        """The session ended: stop serving its endpoint; where it connected to (each host,
        port and decision once, with how many connections: its manifest's list)."""
        if session_id not in self.expected:
            return []
        if self._proxy is not None:  # its connections end and reach its list first
            self._proxy.stop(session_id, wait_s=STOP_WAIT_S)
        with self._lock:
            held = self.expected.pop(session_id, None)
        return list(held.seen.values()) if held is not None else []

    def close(self) -> None:
        with self._lock:
            attached, self._attached = self._attached, None
            proxy, self._proxy = self._proxy, None
        if attached is not None:
            attached[1].close()
        if proxy is not None:
            proxy.close()
            self._records.put(None)

    # --- the kernel's endpoints -----------------------------------------------------------

    def _attach(self) -> None:
        """Attach to the current sandbox's kernel (once a sandbox generation)."""
        generation = self.keeper.generation
        with self._lock:
            if self._attached is not None and self._attached[0] == generation:
                return
            if self._proxy is None:
                limits = Limits(
                    self.settings.max_bytes,
                    self.settings.max_connections,
                    self.settings.connection_s,
                )
                self._proxy = EgressProxy(limits, self._on_record)
                threading.Thread(
                    target=self._publish, name="farm-egress-records", daemon=True
                ).start()
            if self._attached is not None:
                self._attached[1].close()
            channel = self.keeper.kernel().attach_egress()
            self._attached = (generation, channel)
        threading.Thread(
            target=self._endpoints,
            args=(generation, channel),
            name="farm-egress-endpoints",
            daemon=True,
        ).start()

    def _endpoints(self, generation: int, channel: socket.socket) -> None:
        while True:
            try:
                got = recv_frame_fds(channel, 4096)
            except (OSError, FrameError) as exc:
                got = None
                log.info("egress channel of sandbox generation %d: %s", generation, exc)
            if got is None:
                with self._lock:
                    if self._attached is not None and self._attached[1] is channel:
                        self._attached = None
                channel.close()
                return
            frame, fds = got
            endpoint = socket.socket(fileno=fds[0]) if fds else None
            for extra in fds[1:]:
                socket.socket(fileno=extra).close()
            held = self.expected.get(str(frame.get("session_id")))
            if endpoint is None:
                continue
            if held is None or self._proxy is None:  # nobody's: no policy, no way out
                endpoint.close()
                continue
            self._proxy.serve(frame["session_id"], endpoint, held.policy)

    # --- records --------------------------------------------------------------------------

    def _on_record(self, session_id: str, record: Record) -> None:
        held = self.expected.get(session_id)
        recorder, journal = None, False
        if held is not None:  # the box's list, at once (``forget`` reads it)
            held.saw(record)
            held.events += 1
            if held.events <= EVENTS_KEPT:  # past them a box's flood is only counted
                recorder, journal = held.recorder, held.journal
        with self._published:
            self._unpublished[session_id] += 1
        self._records.put(_Ended(session_id, record, recorder, journal))  # never blocks here

    def _publish(self) -> None:
        while (ended := self._records.get()) is not None:
            try:
                self._record(ended)
            except Exception:
                log.exception("egress record of session %s", ended.session_id)
            with self._published:
                self._unpublished[ended.session_id] -= 1
                if not self._unpublished[ended.session_id]:
                    del self._unpublished[ended.session_id]
                self._published.notify_all()

    def _record(self, ended: _Ended) -> None:
        session_id, record = ended.session_id, ended.record
        decision = "allowed" if record.allowed else "denied"
        metrics.EGRESS_CONNECTIONS.labels(decision=decision).inc()
        metrics.EGRESS_BYTES.labels(direction="out").inc(record.bytes_out)
        metrics.EGRESS_BYTES.labels(direction="in").inc(record.bytes_in)
        log.debug(
            "egress of session %s on worker %s: %s:%d %s %s",
            session_id,
            self.worker_id,
            record.host,
            record.port,
            decision,
            record.reason,
        )
        fields: dict[str, Any] = asdict(record)
        if ended.recorder is not None and ended.recorder.egress(fields):
            return
        if ended.journal:
            event = Egress(exec_id="", session_id=session_id, seq=0, ts=time.time(), **fields)
            try:
                self.journal.append([event])
            except Exception as exc:
                log.warning("egress event of session %s not journaled: %s", session_id, exc)


@dataclass
class _Ended:
    """A connection that ended, with where its event goes (as it was when it ended)."""

    session_id: str
    record: Record
    recorder: ExecRecorder | None
    journal: bool
