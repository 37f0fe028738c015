"""The worker's Celery app and tasks, built on demand: importing any ``farm.worker`` module
builds nothing. ``celery -A farm.worker worker`` (through ``farm.worker.app``) and ``farm worker``
both end in ``worker_app()``, which starts the worker's sandbox once Celery is set up and
consumes the image's shared queue plus this generation's direct queue.

Tasks are thin: they hand their JSON argument, unread, to the ``Worker``'s calls, which check it
against its request model (``farm.models.worker_requests``), and return their JSON answer.
``make_worker_app(settings, worker=...)`` binds an already started ``Worker`` instead, which is
how tests run a real Celery worker in-process (``celery.contrib.testing``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from concurrent.futures import Future
from typing import Any

from celery import Celery
from celery.concurrency import get_implementation
from celery.signals import celeryd_after_setup, worker_shutdown

from farm.celeryconf import (
    TASK_BRANCH,
    TASK_CLOSE,
    TASK_COMMAND,
    TASK_DRAIN,
    TASK_ECHO,
    TASK_EXEC,
    TASK_FILE,
    TASK_RUN,
    TASK_SNAPSHOT,
    make_app,
)
from farm.errors import FarmError
from farm.settings import FarmSettings
from farm.worker.session_branches import branch
from farm.worker.startup import check_broker
from farm.worker.task_reply import replying
from farm.worker.worker_state import Worker

log = logging.getLogger(__name__)


class NotAWorker(FarmError):
    """A farm task ran in a process that has no started farm worker."""


def make_worker_app(
    settings: FarmSettings | None = None, worker: Worker | None = None, *, early: bool = False
) -> Celery:
    """A Celery app with farm's tasks. Without ``worker``, the ``Worker`` is made and started
    when Celery's worker is set up (``celeryd_after_setup``) and stopped at its shutdown;
    ``early`` starts it now instead, in a thread, while Celery sets up (``farm worker``: its
    sandbox's start is most of a worker's), and Celery's setup waits for it."""
    settings = settings or FarmSettings()
    app = make_app(settings)
    state: dict[str, Worker] = {"worker": worker} if worker is not None else {}
    ahead = starting(settings) if early and worker is None else None

    def current() -> Worker:
        held = state.get("worker")
        if held is None:
            raise NotAWorker("this process is not a started farm worker")
        return held

    if worker is None:

        @celeryd_after_setup.connect(weak=False)
        def start(sender: Any, instance: Any, **kwargs: Any) -> None:
            if instance.app is not app:
                return
            allowed = {get_implementation("threads"), get_implementation("solo")}
            if get_implementation(instance.pool_cls) not in allowed:
                # Prefork children would each hold a different part of the sessions.
                if ahead is not None:
                    with contextlib.suppress(Exception):  # its own failure is said below
                        ahead.result().stop("Celery's pool cannot serve it")
                raise SystemExit(
                    f"farm workers need `--pool threads` (or solo), not {instance.pool_cls}: "
                    "one process must own the sandbox and every session on it"
                )
            try:
                started = ahead.result() if ahead is not None else started_worker(settings)
            except FarmError as exc:  # no sandbox at all (a bad image): say so and stop, now
                log.error("farm worker %s cannot start: %s", settings.worker_name, exc)
                raise SystemExit(f"farm worker cannot start its sandbox: {exc}") from exc
            state["worker"] = started
            queues = instance.app.amqp.queues
            for queue in started.queues:
                queues.select_add(queue)
            # Only these: Celery would also consume its default queue, farm.default, and a
            # worker of another image would open the default image's sessions in its own.
            queues.select(started.queues)
            started.intake.start()  # map chunks: taken while it has room, beside its queues

        @worker_shutdown.connect(weak=False)
        def stop(**kwargs: Any) -> None:
            held = state.pop("worker", None)
            if held is None and ahead is not None and ahead.done() and not ahead.exception():
                held = ahead.result()  # started, but Celery ended before it took it
            if held is not None:
                held.stop("graceful shutdown")

    # shared=False: Celery otherwise lends a decorated task to every app of the process, so a
    # second worker in one process (the in-process tests) would answer with the first's tasks.
    @app.task(name=TASK_EXEC, shared=False, bind=True)
    def exec_code(task: Any, request: object) -> dict[str, Any]:
        worker = current()
        execute = functools.partial(worker.calls.execute, reply=replying(task))
        return worker.snapshots.guarded(request, execute, "exec")

    @app.task(name=TASK_CLOSE, shared=False)
    def close_session(request: object) -> dict[str, Any]:
        return current().calls.close(request)

    @app.task(name=TASK_RUN, shared=False)
    def run_once(request: object) -> dict[str, Any]:
        return current().calls.run_once(request)

    @app.task(name=TASK_COMMAND, shared=False)
    def run_command(request: object) -> dict[str, Any]:
        worker = current()
        return worker.snapshots.guarded(request, worker.calls.command, "command")

    @app.task(name=TASK_FILE, shared=False)
    def file_operation(request: object) -> dict[str, Any]:
        worker = current()
        return worker.snapshots.guarded(request, worker.calls.file, "file")

    @app.task(name=TASK_DRAIN, shared=False)
    def drain(request: object) -> dict[str, Any]:
        return current().drain.asked(request)

    @app.task(name=TASK_SNAPSHOT, shared=False)
    def snapshot(request: object) -> dict[str, Any]:
        return current().snapshots.take(request)

    @app.task(name=TASK_BRANCH, shared=False)
    def branch_session(request: object) -> dict[str, Any]:
        worker = current()
        return branch(worker, worker.calls, request)

    @app.task(name=TASK_ECHO, shared=False)
    def echo(payload: Any) -> Any:
        """A bare round trip through broker and worker: the baseline of ``bench/farm_e2e.py``."""
        return payload

    return app


def started_worker(settings: FarmSettings) -> Worker:
    """A ``Worker`` started: its generation taken, its sandbox answering, registered."""
    worker = Worker(settings)
    worker.start()
    return worker


def starting(settings: FarmSettings) -> Future[Worker]:
    """``started_worker`` in a thread of its own (a daemon's, as Celery's start may fail)."""
    future: Future[Worker] = Future()

    def run() -> None:
        try:
            future.set_result(started_worker(settings))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="farm-worker-start", daemon=True).start()
    return future


@functools.cache
def worker_app(early: bool = False) -> Celery:
    """The app of this process's farm worker (``celery -A farm.worker``, ``farm worker``),
    once the broker took this worker's credentials (a refusal ends the process, saying so:
    ``farm.worker.startup``; checked here, before Celery, which would retry it for ever)."""
    settings = FarmSettings()
    check_broker(settings, settings.worker_name)
    return make_worker_app(settings, early=early)
