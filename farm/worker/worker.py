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

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from farm.celeryconf import direct_queue
from farm.image_name import ImageName
from farm.journal import Journal
from farm.kernel.wire.client import KernelClient, KernelError, KernelRequestError
from farm.models import Refused, SandboxHealth
from farm.registry import Registry
from farm.sandbox.factory import sandboxes
from farm.sandbox.keeper import SandboxKeeper
from farm.settings import FarmSettings
from farm.worker import metrics
from farm.worker.batch import BatchRunner
from farm.worker.calls import SessionCalls
from farm.worker.egress import PolicyError, WorkerEgress

log = logging.getLogger(__name__)

DUPLICATE_POLL_S = 0.05
# Kernel refusals of a request that was whole and valid but not acceptable: bad input.
REAP_EVERY_S = 10.0


@dataclass
class HeldSession:
    sandbox_generation: int
    epoch: int
    last_used: float
    lost: str | None = None


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
        self._lock = threading.Lock()
        self._local = threading.local()
        self._clients: set[KernelClient] = set()
        self._stop = threading.Event()
        self._http: Any = None
        self.metrics_url = ""
        self.batch = BatchRunner(self)
        self.calls = SessionCalls(self)
        self.egress = WorkerEgress(settings.egress, self.keeper, self.journal, self.id)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self.generation = self.registry.next_generation(self.id)
        self.queue = direct_queue(self.id, self.generation)
        self.keeper.start()
        self._http = metrics.serve(
            self.settings.metrics_host, self.settings.metrics_port, self.readiness
        )
        self.metrics_url = f"http://{self.settings.metrics_host}:{self._http.server_port}"
        self._heartbeat()
        threading.Thread(target=self._beat, name="farm-heartbeat", daemon=True).start()
        log.info(
            "worker %s generation %d serving image %s on %s (metrics %s)",
            self.id,
            self.generation,
            self.image,
            self.queue,
            self.metrics_url,
        )

    def stop(self, reason: str = "the worker stopped") -> None:
        """Remove the sandbox first, then deregister (best effort: Redis may be gone too)."""
        self._stop.set()
        with self._lock:
            held, self.sessions = self.sessions, {}
            clients, self._clients = self._clients, set()
        self.batch.stop()
        self.egress.close()
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

    def _heartbeat(self) -> None:
        health = self.keeper.last_health  # probed by the keeper's watchdog, never here
        metrics.SANDBOX_UP.set(1 if health.ok else 0)
        if health.rtt_s is not None and health is not self._observed:
            metrics.KERNEL_RTT.observe(health.rtt_s)
            self._observed = health
        metrics.SESSIONS_ACTIVE.set(len(self.sessions))
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
                "capacity": self.settings.max_sessions,
                "sessions": len(self.sessions),
                "ready": health.ok,
                "sandbox": info,
                "restarts": self.keeper.restarts,
                "metrics": self.metrics_url,
                "host": socket.gethostname(),
                "pid": os.getpid(),
            },
        )

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
            for session_id, held in self.sessions.items():
                if held.sandbox_generation == sandbox_generation:
                    held.lost = f"its sandbox died ({reason})"
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

    def open_session(
        self,
        tools: bool = True,
        open_id: str | None = None,
        limits: dict[str, Any] | None = None,
        egress: list[str] | None = None,
    ) -> dict[str, Any]:
        """Open a session in a box of its own (``limits`` over ``FarmSettings.box``, which the
        sandbox's kernel holds as its boxes' defaults; ``egress``: the hosts it may reach,
        within the farm's ceiling); ``open_id`` is claimed first, like an exec id.

        The claim names this worker generation, so a client whose open was taken by a worker
        that then died sees the death (heartbeat) and asks again, instead of waiting for an
        answer that will never come (the message was acked when the task started).
        """
        if open_id is not None:
            claim = self.registry.claim_exec(open_id, self.id, self.generation)
            if claim is not None:  # a duplicate delivery: answer what the first one did
                recorded = claim.get("result")
                return (
                    recorded
                    if recorded
                    else {
                        "busy": True,
                        "worker": self.id,
                        "reason": "this open was abandoned or is under way",
                    }
                )
            reply = self._open_session(tools, limits, egress)
            self.registry.finish_exec(open_id, reply)
            return reply
        return self._open_session(tools, limits, egress)

    def _open_session(
        self, tools: bool, limits: dict[str, Any] | None, egress: list[str] | None = None
    ) -> dict[str, Any]:
        with self._lock:
            if len(self.sessions) >= self.settings.max_sessions:
                return {"busy": True, "worker": self.id, "reason": "at capacity"}
        if not self.keeper.ready:
            return {"busy": True, "worker": self.id, "reason": self.keeper.last_error}
        try:
            policy = self.egress.policy(egress)
        except PolicyError as exc:
            return Refused(worker=self.id, reason=str(exc)).model_dump()
        session_id = uuid.uuid4().hex if policy is not None else None
        try:  # the box's defaults are the kernel's own (FarmSettings.box, given at its start)
            if session_id is not None and policy is not None:
                self.egress.expect(session_id, policy)
            with self.kernel() as kernel:
                opened = kernel.open_session(
                    tools=tools, limits=limits, session_id=session_id, egress=policy is not None
                )
        except KernelRequestError as exc:
            self.egress.forget(session_id or "")
            if exc.code not in ("bad_limits", "bad_request"):
                raise
            return Refused(worker=self.id, reason=str(exc)).model_dump()
        except KernelError as exc:  # the sandbox is failing: let the client try elsewhere
            self.egress.forget(session_id or "")
            return {"busy": True, "worker": self.id, "reason": f"sandbox failed: {exc}"}
        session_id, epoch = opened["session_id"], opened["epoch"]
        with self._lock:
            self.sessions[session_id] = HeldSession(self.keeper.generation, epoch, time.monotonic())
        self.registry.put_session(*self.session_entry(session_id, epoch))
        log.info("session %s opened on worker %s", session_id, self.id)
        return {
            "session_id": session_id,
            "epoch": epoch,
            "worker": self.id,
            "generation": self.generation,
            "queue": self.queue,
        }

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
        return {"session_id": session_id, "closed": held is not None}
