"""The worker's Celery app and tasks. ``celery -A farm.worker worker`` works as well as
``farm worker``; both start the worker's sandbox when Celery is set up and consume the image's
shared queue plus this generation's direct queue.

Tasks are thin: they hand their JSON arguments to the ``Worker`` and return its JSON answer.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.concurrency import get_implementation
from celery.signals import celeryd_after_setup, worker_shutdown

from farm.celeryconf import TASK_CLOSE, TASK_ECHO, TASK_EXEC, TASK_OPEN, TASK_RUN, make_app
from farm.settings import FarmSettings
from farm.worker.worker import Worker

log = logging.getLogger(__name__)

app = make_app()
_state: dict[str, Worker] = {}


def current() -> Worker:
    worker = _state.get("worker")
    if worker is None:
        raise RuntimeError("this process is not a started farm worker")
    return worker


@celeryd_after_setup.connect
def _start_worker(sender: Any, instance: Any, **kwargs: Any) -> None:
    allowed = {get_implementation("threads"), get_implementation("solo")}
    if get_implementation(instance.pool_cls) not in allowed:
        # Prefork children would each hold a different part of the sessions.
        raise SystemExit(
            f"farm workers need `--pool threads` (or solo), not {instance.pool_cls}: one "
            "process must own the sandbox and every session on it"
        )
    worker = Worker(FarmSettings())
    worker.start()
    _state["worker"] = worker
    for queue in worker.queues:
        instance.app.amqp.queues.select_add(queue)


@worker_shutdown.connect
def _stop_worker(**kwargs: Any) -> None:
    worker = _state.pop("worker", None)
    if worker is not None:
        worker.stop("graceful shutdown")


@app.task(name=TASK_OPEN)
def open_session(tools: bool = True, open_id: str | None = None) -> dict[str, Any]:
    return current().open_session(tools, open_id)


@app.task(name=TASK_EXEC)
def exec_code(request: dict[str, Any]) -> dict[str, Any]:
    return current().execute(request)


@app.task(name=TASK_CLOSE)
def close_session(session_id: str) -> dict[str, Any]:
    return current().close_session(session_id)


@app.task(name=TASK_RUN)
def run_once(request: dict[str, Any]) -> dict[str, Any]:
    return current().run_once(request)


@app.task(name=TASK_ECHO)
def echo(payload: Any) -> Any:
    """A bare round trip through broker and worker: the baseline of ``bench/farm.py``."""
    return payload
