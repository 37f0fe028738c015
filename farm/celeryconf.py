"""The Celery app both sides build from settings, and the names that tie them together.

The client reaches workers only through these task names and queue names (an image's own is
``ImageName.queue``), never by import.
JSON only (no pickle: a broker message must never be able to run code), prefetch 1 so a busy
worker does not hoard messages another could run. Celery's transport and result backend get the
same password and TLS options as the registry (``FarmSettings.redis_url``, ``redis_tls``).
"""

from __future__ import annotations

from celery import Celery

from farm.settings import FarmSettings

TASK_EXEC = "farm.exec"
TASK_CLOSE = "farm.close_session"
TASK_RUN = "farm.run"
TASK_COMMAND = "farm.command"  # a command in a session's box (session.exec)
TASK_FILE = "farm.file"  # one chunk of a file operation of a session (session.files)
TASK_BRANCH = "farm.branch"  # a session's checkpoint, rollback, drop or fork
TASK_SNAPSHOT = "farm.snapshot"  # a session's snapshot, or its pause (farm.client.snapshots)
TASK_DRAIN = "farm.drain"  # move a worker's sessions to others (farm.worker.drain)
TASK_ECHO = "farm.echo"  # the bare round trip benchmarks compare against


def direct_queue(worker_id: str, generation: int) -> str:
    """One worker generation's own queue: a successor never consumes its predecessor's."""
    return f"farm.w.{worker_id}.g{generation}"


def make_app(settings: FarmSettings | None = None) -> Celery:
    settings = settings or FarmSettings()
    url, tls = settings.redis_url, settings.redis_tls
    app = Celery("farm", broker=url, backend=url)
    if tls is not None:
        app.conf.update(broker_use_ssl=tls, redis_backend_use_ssl=tls)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        worker_prefetch_multiplier=1,
        task_acks_late=False,
        result_expires=3600,
        task_default_queue="farm.default",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        # Tasks are acked when they start, so this only redelivers messages a dead worker had
        # prefetched but not started: they reach another worker within about 65 s. kombu
        # scans for them every interval * throttle seconds (default 10 * 10, which would add
        # up to 100 s); the scan is one ZRANGE, cheap at every 5 s.
        broker_transport_options={
            "visibility_timeout": 60,
            "unacked_restore_interval": 5,
            "unacked_restore_throttle": 1,
        },
        # Task events cost ~13 Redis PUBLISHes per exec; Flower turns them on when it runs.
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app
