"""``python -m farm.worker.spare``: a worker started ahead of its image (``farm.local.spares``).

It imports what a worker's start imports, then waits for one JSON line on stdin: ``env``, the
worker's whole environment, and ``log``, the file its output goes to; it takes them and runs
``farm.worker.__main__.main``. Nothing here reads settings, connects or starts a thread before
that line: the worker it becomes is the one its environment names. Stdin closed unread: exit 0.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

# What a worker's start imports beyond ``farm.worker.tasks``: Celery's worker (not its command
# line: ``farm.worker.__main__.run_worker``) and its bootsteps, the broker's transport,
# Docker's client and farm's sandboxes.
AHEAD = (
    "farm.worker.tasks",
    "farm.sandbox.docker",
    "farm.sandbox.process",
    "celery.apps.worker",
    "celery.worker.consumer.consumer",
    "celery.worker.components",
    "celery.worker.autoscale",
    "celery.concurrency.thread",
    "celery.backends.redis",
    "kombu.transport.redis",
    "docker",
)


def main() -> None:
    for module in AHEAD:
        importlib.import_module(module)
    line = sys.stdin.buffer.readline()
    if not line:
        return
    order = json.loads(line)
    os.environ.clear()
    os.environ.update(order["env"])
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from farm.worker.__main__ import main as worker_main

    worker_main([])


if __name__ == "__main__":
    main()
