"""Prometheus metrics of a worker and its small HTTP server (``/metrics``, ``/healthz``,
``/readyz``): liveness says the worker process serves; readiness says its sandbox answers,
which is what probes and the router need.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from farm.models import ErrorKind

REGISTRY = CollectorRegistry()
EXEC_DURATION = Histogram(
    "farm_exec_duration_seconds",
    "Wall time of execs, by status and failure kind",
    ["status", "kind"],
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300),
)
EXEC_TOTAL = Counter(
    "farm_exec_total", "Execs, by status and failure kind", ["status", "kind"], registry=REGISTRY
)
EXEC_TIMEOUTS = Counter("farm_exec_timeouts_total", "Execs that timed out", registry=REGISTRY)
EXEC_OOM = Counter("farm_exec_oom_total", "Execs that ran out of memory", registry=REGISTRY)
SESSIONS_ACTIVE = Gauge("farm_sessions_active", "Sessions held by this worker", registry=REGISTRY)
SANDBOX_UP = Gauge("farm_sandbox_up", "1 when the sandbox answers", registry=REGISTRY)
SANDBOX_ISOLATION = Gauge(
    "farm_sandbox_isolation",
    "1 for what a box is in this worker's sandbox (namespaces; uids: the loud fallback; dirs)",
    ["isolation"],
    registry=REGISTRY,
)
EGRESS_CONNECTIONS = Counter(
    "farm_egress_connections",
    "Connections through boxes' egress proxy, by decision (allowed, denied)",
    ["decision"],
    registry=REGISTRY,
)
EGRESS_BYTES = Counter(
    "farm_egress_bytes",
    "Bytes through boxes' egress proxy, by direction (out: from boxes, in: to boxes)",
    ["direction"],
    registry=REGISTRY,
)
BOXES_CAPACITY = Gauge(
    "farm_boxes_capacity",
    "Boxes of the default limits this worker's sandbox holds in all (the kernel's capacity)",
    ["image"],
    registry=REGISTRY,
)
BOXES_FREE = Gauge(
    "farm_boxes_free",
    "Boxes free now, beyond what waiting work is owed",
    ["image"],
    registry=REGISTRY,
)
BOXES_IN_USE = Gauge(
    "farm_boxes_in_use", "Boxes of sessions and items admitted now", ["image"], registry=REGISTRY
)
WORK_WAITING = Gauge(
    "farm_work_waiting",
    "Work waiting inside this worker for a box, by kind (open: session opens; item: map "
    "items); with the image's list of chunks, what an autoscaler adds workers for",
    ["image", "kind"],
    registry=REGISTRY,
)
SANDBOX_RESTARTS = Counter("farm_sandbox_restarts_total", "Sandbox replacements", registry=REGISTRY)
KERNEL_RTT = Histogram(
    "farm_kernel_rtt_seconds",
    "Watchdog ping round trip to the kernel",
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2),
)


def observe_exec(status: str, kind: str | None, duration_s: float) -> None:
    label = kind or "none"
    EXEC_DURATION.labels(status, label).observe(duration_s)
    EXEC_TOTAL.labels(status, label).inc()
    if kind == ErrorKind.TIMEOUT:
        EXEC_TIMEOUTS.inc()
    elif kind == ErrorKind.OOM:
        EXEC_OOM.inc()


def observe_room(image: str, room: Mapping[str, Any]) -> None:
    """A worker's room (``Worker.room``), once a heartbeat."""
    BOXES_CAPACITY.labels(image).set(room["boxes"])
    BOXES_FREE.labels(image).set(room["free"])
    BOXES_IN_USE.labels(image).set(room["in_use"])
    for kind, count in room["waiting"].items():
        WORK_WAITING.labels(image, kind).set(count)


def serve(host: str, port: int, ready: Callable[[], tuple[bool, str]]) -> ThreadingHTTPServer:
    """Start the HTTP server in a daemon thread; ``server.server_port`` is the bound port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif self.path == "/readyz":
                ok, detail = ready()
                self._send(200 if ok else 503, f"{detail}\n".encode(), "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="farm-metrics", daemon=True).start()
    return server
