"""``SandboxKeeper``: keeps one sandbox alive for its owner (a worker), whatever the backend.

A watchdog thread pings the kernel; when the sandbox dies (killed, OOM-killed, stopped
answering) the keeper removes it, which makes every call in flight fail at once, tells its
owner (``on_lost``: the sessions it held are lost and must be reported so, never silently
recreated), and starts a replacement. ``generation`` counts sandboxes, ``restarts`` the
replacements. While no sandbox can be started the keeper is not ``ready`` and retries with
backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from farm.backoff import delays
from farm.kernel.wire.client import KernelClient
from farm.models import SandboxHealth, SandboxInfo
from farm.sandbox.backend import Sandbox

log = logging.getLogger(__name__)

MISSES_BEFORE_REPLACE = 2
MAX_BACKOFF_S = 30.0


class SandboxKeeper:
    def __init__(
        self,
        factory: Callable[[], Sandbox],
        *,
        interval_s: float = 1.0,
        ping_timeout_s: float = 2.0,
        on_lost: Callable[[int, str], None] | None = None,
    ) -> None:
        self.factory = factory
        self.interval_s = interval_s
        self.ping_timeout_s = ping_timeout_s
        self.on_lost = on_lost
        self.generation = 0
        self.restarts = 0
        self.last_error = ""
        self._sandbox: Sandbox | None = None
        # the watchdog's last probe: what the worker's heartbeat reports, so that a heartbeat
        # never waits on a starved kernel or a busy Docker daemon (and never lapses for it)
        self.last_health = SandboxHealth(ok=False, detail="not started")
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return self._sandbox is not None

    @property
    def sandbox(self) -> Sandbox:
        sandbox = self._sandbox
        if sandbox is None:
            from farm.errors import SandboxUnavailable

            raise SandboxUnavailable(f"no sandbox is running: {self.last_error or 'not started'}")
        return sandbox

    def kernel(self) -> KernelClient:
        return self.sandbox.kernel()

    def start(self, launched: Callable[[], None] | None = None) -> None:
        """Start the first sandbox (raising if it cannot start; ``launched``: ``Sandbox.start``)
        and the watchdog."""
        self._launch(launched)
        self._thread = threading.Thread(target=self._watch, name="farm-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            if self._sandbox is not None:
                self._sandbox.stop()
                self._sandbox = None

    def __enter__(self) -> SandboxKeeper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _launch(self, launched: Callable[[], None] | None = None) -> None:
        sandbox = self.factory()
        sandbox.start(launched)
        health = sandbox.health(self.ping_timeout_s)  # its capacity, known before any work
        with self._lock:
            self._sandbox = sandbox
            self.generation += 1
            self.last_error = ""
            self.last_health = health if health.ok else SandboxHealth(ok=True, detail="started")

    def health(self) -> SandboxHealth:
        sandbox = self._sandbox
        if sandbox is None:
            return SandboxHealth(ok=False, detail=self.last_error or "no sandbox")
        return sandbox.health(self.ping_timeout_s)

    def info(self) -> SandboxInfo:
        info = self.sandbox.info()
        return info.model_copy(update={"restarts": self.restarts})

    def replace(self, reason: str) -> None:
        """Throw the current sandbox away (failing calls in flight) and start another."""
        with self._lock:
            old, self._sandbox = self._sandbox, None
            lost_generation = self.generation
            self.last_error = reason
            self.last_health = SandboxHealth(ok=False, detail=reason)
        if old is None:
            return
        log.warning("sandbox generation %d lost: %s; replacing it", lost_generation, reason)
        old.stop()
        if self.on_lost is not None:
            try:
                self.on_lost(lost_generation, reason)
            except Exception:
                log.exception("on_lost callback failed")
        self.restarts += 1
        self._relaunch()

    def _relaunch(self) -> None:
        for backoff in delays(0.5, MAX_BACKOFF_S):
            if self._stop.is_set():
                return
            try:
                self._launch()
                log.info("replacement sandbox generation %d is up", self.generation)
                return
            except Exception as exc:
                self.last_error = f"replacement failed: {exc}"
                log.error("could not start a replacement sandbox: %s", exc)
                self._stop.wait(backoff)

    def _watch(self) -> None:
        misses = 0
        while not self._stop.wait(self.interval_s):
            if self._sandbox is None:
                self._relaunch()
                continue
            health = self.last_health = self.health()
            misses = 0 if health.ok else misses + 1
            if misses >= MISSES_BEFORE_REPLACE:
                misses = 0
                self.replace(health.detail)
