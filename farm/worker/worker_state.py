"""``Worker``: one Celery worker's state — its sandbox, its sessions, its place in the registry.

Invariants:
- a worker generation consumes only its own direct queue, so messages left for a dead
  generation are never run by its successor;
- a session belongs to one sandbox generation; once that sandbox is replaced every call of
  the session fails with ``sandbox_lost`` (never silently runs in a fresh sandbox);
- an ``exec_id`` is claimed in Redis before its code runs, so a redelivered or duplicated
  message returns the recorded result instead of running twice;
- user errors, timeouts and OOMs are results; nothing here retries them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from farm.celeryconf import direct_queue
from farm.events.journal import Journal
from farm.image_name import ImageName
from farm.kernel.wire.client import KernelClient, KernelError, KernelRequestError
from farm.models import BoxCapacity, SandboxHealth
from farm.registry import Registry, chunks_key, opens_key
from farm.sandbox.factory import sandboxes
from farm.sandbox.sandbox_keeper import SandboxKeeper
from farm.settings import FarmSettings
from farm.worker import metrics
from farm.worker.batch_runner import BatchRunner
from farm.worker.box_gate import (
    BoxGate,
    Ticket,
)
from farm.worker.drain import Drain
from farm.worker.intake import Intake
from farm.worker.judge_items import parallel as judge_parallel
from farm.worker.opens import SessionOpens
from farm.worker.run_lane import LaneReply, RunLane
from farm.worker.session_calls import SessionCalls
from farm.worker.snapshot_calls import SessionSnapshots
from farm.worker.worker_egress import WorkerEgress
from farm.worker.worker_host import HeldSession

log = logging.getLogger(__name__)

REAP_EVERY_S = 10.0


class Worker:
    def __init__(self, settings: FarmSettings) -> None:
        self.settings = settings
        self.id = settings.worker_name
        self.image = settings.image
        self.generation = 0
        self.queue = ""
        self._observed: SandboxHealth | None = None  # the last probe whose RTT was recorded
        self.registry = Registry.connect(settings)
        self.journal = Journal(self.registry.redis, settings)
        self.keeper = SandboxKeeper(
            sandboxes(settings, owner=self.id),
            interval_s=settings.watchdog_interval_s,
            on_lost=self._on_sandbox_lost,
        )
        self.sessions: dict[str, HeldSession] = {}
        # Room for boxes: the kernel's capacity, known once its sandbox answers (``start``).
        self.gate = BoxGate(0, settings.max_sessions, judge_parallel(settings))
        self._lock = threading.Lock()
        self._local = threading.local()
        self._clients: set[KernelClient] = set()
        self._stop = threading.Event()
        self._http: Any = None
        self.metrics_url = ""
        self.batch = BatchRunner(self)
        self.opens = SessionOpens(self)
        shared = ImageName(self.image).queue
        self.intake = Intake(
            self.id,
            (opens_key(shared), chunks_key(shared)),
            self.registry,
            self.gate,
            lambda: self.keeper.ready,
            (self.opens.take, self.batch.take),
        )
        self.calls = SessionCalls(self, self.opens)
        self.snapshots = SessionSnapshots(self, self.calls.held)
        self.lane = RunLane(self.id, self.registry, self._lane_run, settings.worker_threads)
        self.drain = Drain(self)
        self.draining = False  # it takes no new session: its own move away is under way
        self.egress = WorkerEgress(settings.egress, self.keeper, self.journal, self.id)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, launched: Callable[[], None] | None = None) -> None:
        """Take a generation, start the sandbox (``launched``: ``Sandbox.start``) and
        register, ready."""
        self.generation = self.registry.next_generation(self.id)
        self.queue = direct_queue(self.id, self.generation)
        self.keeper.start(launched)
        self._size_gate()
        self._http = metrics.serve(
            self.settings.metrics_host, self.settings.metrics_port, self.readiness
        )
        self.metrics_url = f"http://{self.settings.metrics_host}:{self._http.server_port}"
        log.info(  # before it is registered: whoever sees it ready finds this line written
            "worker %s generation %d serving image %s on %s (metrics %s)",
            self.id,
            self.generation,
            self.image,
            self.queue,
            self.metrics_url,
        )
        self._heartbeat()
        threading.Thread(target=self._beat, name="farm-heartbeat", daemon=True).start()

    def stop(self, reason: str = "the worker stopped") -> None:
        """Move the sessions to other workers (``drain_on_stop``), remove the sandbox, then
        deregister (best effort: Redis may be gone too)."""
        self.lane.stop()  # the runs it took end first; then nothing more comes from it
        if self.settings.drain_on_stop and not self._stop.is_set():
            try:
                self.drain.run(stopping=True)
            except Exception:
                log.exception("worker %s could not drain before it stopped", self.id)
        self._stop.set()
        self.intake.stop()
        with self._lock:
            held, self.sessions = self.sessions, {}
            clients, self._clients = self._clients, set()
        self.batch.stop()
        self.opens.stop()
        self.egress.close()
        self.snapshots.close()
        for client in clients:  # every thread's connection to the kernel
            client.close()
        self.keeper.stop()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()  # its listening socket: a stopped worker frees the port
        try:
            for session_id in held:
                self.registry.drop_session(session_id)
            self.registry.deregister(self.id, self.generation)
        except Exception as exc:
            log.warning("worker %s could not deregister: %s", self.id, exc)
        log.info(
            "worker %s generation %d stopped (%s); %d sessions ended",
            self.id,
            self.generation,
            reason,
            len(held),
        )

    @property
    def queues(self) -> list[str]:
        return [ImageName(self.image).queue, self.queue]

    def readiness(self) -> tuple[bool, str]:
        if not self.keeper.ready:
            return False, f"sandbox not ready: {self.keeper.last_error}"
        return True, f"ready: generation {self.generation}, {len(self.sessions)} sessions"

    def _beat(self) -> None:
        last_reap = time.monotonic()
        while not self._stop.wait(self.settings.heartbeat_interval_s):
            try:
                self._heartbeat()
                if time.monotonic() - last_reap > min(
                    REAP_EVERY_S, self.settings.idle_timeout_s / 2
                ):
                    self._reap_idle()
                    last_reap = time.monotonic()
            except redis.RedisError as exc:  # the broker is down: say so once a beat, briefly
                log.warning("worker %s heartbeat failed: %s", self.id, exc)
            except Exception:
                log.exception("worker %s heartbeat failed", self.id)

    def _size_gate(self) -> BoxCapacity | None:
        """The gate's size from the kernel's last answer (the watchdog's probe)."""
        capacity = self.keeper.last_health.capacity if self.keeper.ready else None
        if capacity is not None:
            self.gate.resize(capacity.usable)
        return capacity

    def box_defaults(self) -> dict[str, int]:
        """A box's limits when a request names none (the kernel's): what ``weight`` counts in."""
        return self.keeper.last_health.box_limits or {"pids": self.settings.box.pids}

    def room(self) -> dict[str, Any]:
        """What this worker can take now: its boxes (the kernel's capacity: in all, free, in
        use), what waits for them, its sessions."""
        return {
            "boxes": self.gate.capacity,
            "in_use": self.gate.in_use,
            "held": dict(self.gate.held),  # boxes admitted, by kind: open, item, judge
            "free": self.gate.room(),
            "waiting": self.gate.waiting(),
            "sessions": len(self.sessions),
            "max_sessions": self.settings.max_sessions,
        }

    def _heartbeat(self) -> None:
        health = self.keeper.last_health  # probed by the keeper's watchdog, never here
        metrics.SANDBOX_UP.set(1 if health.ok else 0)
        if health.rtt_s is not None and health is not self._observed:
            metrics.KERNEL_RTT.observe(health.rtt_s)
            self._observed = health
        metrics.SESSIONS_ACTIVE.set(len(self.sessions))
        kernel = self._size_gate()
        room = self.room()
        metrics.observe_room(self.image, room)
        info = self.keeper.info().model_dump(mode="json") if self.keeper.ready else None
        if info is not None and info.get("isolation"):
            for isolation in ("namespaces", "uids", "dirs"):
                flag = 1 if info["isolation"] == isolation else 0
                metrics.SANDBOX_ISOLATION.labels(isolation=isolation).set(flag)
        self.registry.heartbeat(
            self.id,
            {
                "id": self.id,
                "generation": self.generation,
                "image": self.image,
                "queue": self.queue,
                "capacity": room["boxes"],
                "room": room,
                "kernel": kernel.model_dump() if kernel is not None else None,
                "sessions": len(self.sessions),
                "ready": health.ok,
                "sandbox": info,
                "restarts": self.keeper.restarts,
                "draining": self.draining,
                "metrics": self.metrics_url,
                "host": socket.gethostname(),
                "pid": os.getpid(),
            },
        )

    def beat_now(self) -> None:
        """A heartbeat now, not at the next interval (a drain's start: others must know)."""
        self._heartbeat()

    def _reap_idle(self) -> None:
        cutoff = time.monotonic() - self.settings.idle_timeout_s
        idle = [sid for sid, s in list(self.sessions.items()) if s.last_used < cutoff]
        for session_id in idle:
            log.info(
                "session %s expired after %.0fs idle", session_id, self.settings.idle_timeout_s
            )
            self.close_session(session_id)

    def _on_sandbox_lost(self, sandbox_generation: int, reason: str) -> None:
        metrics.SANDBOX_RESTARTS.inc()
        with self._lock:
            lost = [
                (session_id, held)
                for session_id, held in self.sessions.items()
                if held.sandbox_generation == sandbox_generation
            ]
        for session_id, held in lost:  # their boxes went with the sandbox: so does their room
            held.lost = f"its sandbox died ({reason})"
            self._let_go(held)
            log.warning("session %s on worker %s lost: %s", session_id, self.id, reason)

    # --- kernel access --------------------------------------------------------------------

    @contextmanager
    def kernel(self) -> Iterator[KernelClient]:
        """Lend this thread's connection to the current sandbox's kernel. A kernel failure
        drops it, so the thread's next call connects again; a refusal (``KernelRequestError``)
        keeps it: the client closes its own socket when the kernel closed its end."""
        client = self._thread_client()
        try:
            yield client
        except KernelRequestError:
            raise
        except KernelError:
            self._drop_kernel()
            raise

    def _thread_client(self) -> KernelClient:
        local = self._local
        if getattr(local, "generation", None) != self.keeper.generation:
            self._drop_kernel()
            local.client = self.keeper.kernel()
            local.generation = self.keeper.generation
            with self._lock:
                self._clients.add(local.client)
        client: KernelClient = local.client
        return client

    def _drop_kernel(self) -> None:
        client = getattr(self._local, "client", None)
        if client is not None:
            client.close()
            with self._lock:
                self._clients.discard(client)
        self._local.client = self._local.generation = None

    # --- tasks ----------------------------------------------------------------------------

    def hold(self, session_id: str, epoch: int, ticket: Ticket) -> None:
        """A session just opened here (``SessionOpens``), its box's room held by ``ticket``."""
        with self._lock:
            self.sessions[session_id] = HeldSession(
                self.keeper.generation, epoch, time.monotonic(), ticket=ticket
            )
        self.registry.put_session(*self.session_entry(session_id, epoch))
        log.info("session %s opened on worker %s", session_id, self.id)

    def _lane_run(self, request: object, reply: LaneReply) -> dict[str, Any]:
        """A run of the lane (``RunLane``): the call Celery's ``farm.exec`` task makes."""
        return self.snapshots.guarded(
            request, lambda raw: self.calls.execute(raw, reply=reply), "exec"
        )

    def _let_go(self, held: HeldSession) -> None:
        """A session's room goes back to the gate (once: a ticket released twice is idle)."""
        if held.ticket is not None:
            self.gate.release(held.ticket)

    def let_go_moved(self, session_id: str) -> None:
        """A session that moved to another worker (``Drain``): its box here closes, its
        registry entry (the new owner's) stays."""
        with self._lock:
            held = self.sessions.pop(session_id, None)
        self.egress.forget(session_id)
        with contextlib.suppress(KernelError), self.kernel() as kernel:
            kernel.close_session(session_id)
        if held is not None:
            self._let_go(held)

    def session_entry(self, session_id: str, epoch: int) -> tuple[str, dict[str, Any], float]:
        """The registry's entry of a session held here at ``epoch`` (id, fields, ttl): written
        when it opens and refreshed with each call's result (``Registry.finish_exec``)."""
        fields = {
            "worker": self.id,
            "generation": self.generation,
            "queue": self.queue,
            "image": self.image,
            "epoch": epoch,
        }
        return session_id, fields, self.settings.idle_timeout_s

    def close_session(self, session_id: str) -> dict[str, Any]:
        with self._lock:
            held = self.sessions.pop(session_id, None)
        self.registry.drop_session(session_id)
        self.egress.forget(session_id)
        if held is not None and held.lost is None:
            try:
                with self.kernel() as kernel:
                    kernel.close_session(session_id)
            except KernelError as exc:
                log.info("closing session %s: %s", session_id, exc)
        if held is not None:
            self._let_go(held)
        return {"session_id": session_id, "closed": held is not None}
