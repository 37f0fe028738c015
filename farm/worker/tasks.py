"""The worker's Celery app and tasks, built on demand: importing any ``farm.worker`` module
builds nothing. ``celery -A farm.worker worker`` (through ``farm.worker.app``) and ``farm worker``
both end in ``worker_app()``, which starts the worker's sandbox beside Celery's start and
consumes the image's shared queue plus this generation's direct queue once it answers.

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

from celery import Celery, bootsteps
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
from farm.image_name import ImageName
from farm.settings import FarmSettings
from farm.worker.session_branches import branch
from farm.worker.startup import check_broker
from farm.worker.task_reply import replying, warm_backend
from farm.worker.worker_state import Worker

log = logging.getLogger(__name__)

LAUNCH_WAIT_S = 5.0  # at most this long before Celery's setup; the start goes on beside it
SHOWN = {"resultrepr_maxsize": 80}  # of a result, in the success line: ids, not output


class NotAWorker(FarmError):
    """A farm task ran in a process that has no started farm worker."""


def make_worker_app(
    settings: FarmSettings | None = None, worker: Worker | None = None, *, early: bool = False
) -> Celery:
    """A Celery app with farm's tasks. Without ``worker``, the ``Worker`` is made and started
    in a thread, beside Celery's own start: from now when ``early`` (``farm worker``: its
    sandbox's start is most of a worker's), else once Celery is set up
    (``celeryd_after_setup``); it is stopped at Celery's shutdown. Celery's consumer connects
    meanwhile and takes no message before the ``Worker`` has started (``Serving``)."""
    settings = settings or FarmSettings()
    app = make_app(settings)
    app.conf.result_backend_thread_safe = True  # the threads share one pool (warm_backend)
    state: dict[str, Worker] = {"worker": worker} if worker is not None else {}
    ahead: list[Future[Worker]] = [starting(settings)] if early and worker is None else []

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
                if ahead:
                    with contextlib.suppress(Exception):  # its own failure is said below
                        ahead[0].result().stop("Celery's pool cannot serve it")
                raise SystemExit(
                    f"farm workers need `--pool threads` (or solo), not {instance.pool_cls}: "
                    "one process must own the sandbox and every session on it"
                )
            if not ahead:
                ahead.append(starting(settings))
            # Only the image's queue, until Serving adds the worker's own: Celery would also
            # consume its default queue, farm.default, and a worker of another image would
            # open the default image's sessions in its own.
            queues, shared = instance.app.amqp.queues, ImageName(settings.image).queue
            queues.select_add(shared)
            queues.select([shared])
            warm_backend(instance.app)

        worker_name = settings.worker_name

        class Serving(bootsteps.StartStopStep):  # type: ignore[misc]
            """The consumer's last step before its event loop, which takes the messages: it
            waits for the started ``Worker`` (a worker's messages need its sandbox) and
            consumes its queues. A sandbox that cannot start ends the worker, saying why."""

            # After every step that may take time (Control declares its queue, Heart sends):
            # those run while the sandbox starts, not after it.
            requires = (
                "celery.worker.consumer.tasks:Tasks",
                "celery.worker.consumer.control:Control",
                "celery.worker.consumer.heart:Heart",
            )

            def start(self, c: Any) -> None:
                if "worker" in state:  # the consumer restarts after a lost connection
                    return
                try:
                    started = ahead[0].result()
                except FarmError as exc:  # no sandbox at all (a bad image): say so and stop
                    log.error("farm worker %s cannot start: %s", worker_name, exc)
                    raise SystemExit(f"farm worker cannot start its sandbox: {exc}") from exc
                state["worker"] = started
                for queue in started.queues:
                    c.app.amqp.queues.select_add(queue)
                    c.add_task_queue(queue)
                started.intake.start()  # map chunks: taken while it has room, beside its queues
                started.lane.start(started.queue)  # its sessions' plain runs

        app.steps["consumer"].add(Serving)

        @worker_shutdown.connect(weak=False)
        def stop(**kwargs: Any) -> None:
            held = state.pop("worker", None)
            if held is None and ahead and ahead[0].done() and not ahead[0].exception():
                held = ahead[0].result()  # started, but Celery ended before it took it
            if held is not None:
                held.stop("graceful shutdown")

    # SHOWN: Celery's log line of a task's success holds a repr of its result (a cell's
    # output), built for every task (~120 us for an exec's); farm's show their first ids.
    # shared=False: Celery otherwise lends a decorated task to every app of the process, so a
    # second worker in one process (the in-process tests) would answer with the first's tasks.
    @app.task(name=TASK_EXEC, shared=False, bind=True, **SHOWN)
    def exec_code(task: Any, request: object) -> dict[str, Any]:
        worker = current()
        execute = functools.partial(worker.calls.execute, reply=replying(task))
        return worker.snapshots.guarded(request, execute, "exec")

    @app.task(name=TASK_CLOSE, shared=False, **SHOWN)
    def close_session(request: object) -> dict[str, Any]:
        return current().calls.close(request)

    @app.task(name=TASK_RUN, shared=False, **SHOWN)
    def run_once(request: object) -> dict[str, Any]:
        return current().calls.run_once(request)

    @app.task(name=TASK_COMMAND, shared=False, **SHOWN)
    def run_command(request: object) -> dict[str, Any]:
        worker = current()
        return worker.snapshots.guarded(request, worker.calls.command, "command")

    @app.task(name=TASK_FILE, shared=False, **SHOWN)
    def file_operation(request: object) -> dict[str, Any]:
        worker = current()
        return worker.snapshots.guarded(request, worker.calls.file, "file")

    @app.task(name=TASK_DRAIN, shared=False, **SHOWN)
    def drain(request: object) -> dict[str, Any]:
        return current().drain.asked(request)

    @app.task(name=TASK_SNAPSHOT, shared=False, **SHOWN)
    def snapshot(request: object) -> dict[str, Any]:
        return current().snapshots.take(request)

    @app.task(name=TASK_BRANCH, shared=False, bind=True, **SHOWN)
    def branch_session(task: Any, request: object) -> dict[str, Any]:
        worker = current()
        return branch(worker, worker.calls, request, replying(task))

    @app.task(name=TASK_ECHO, shared=False)
    def echo(payload: Any) -> Any:
        """A bare round trip through broker and worker: the baseline of ``bench/farm_e2e.py``."""
        return payload

    return app


def starting(settings: FarmSettings) -> Future[Worker]:
    """A ``Worker`` starting in a thread of its own (a daemon's, as Celery's start may fail):
    its generation taken, its sandbox answering, registered. Returns once its sandbox's
    container or process exists (or the start failed, or ``LAUNCH_WAIT_S`` passed): what
    the caller does next (Celery's setup) would compete with the start for the interpreter,
    while the container's and the kernel's start need this process only to wait."""
    future: Future[Worker] = Future()
    launched = threading.Event()

    def run() -> None:
        try:
            worker = Worker(settings)
            worker.start(launched.set)
            future.set_result(worker)
        except BaseException as exc:
            future.set_exception(exc)
        finally:
            launched.set()

    threading.Thread(target=run, name="farm-worker-start", daemon=True).start()
    launched.wait(LAUNCH_WAIT_S)
    return future


_APPS: dict[bool, Celery] = {}  # worker_app's, by ``early``: one per process


def worker_app(early: bool = False, settings: FarmSettings | None = None) -> Celery:
    """The app of this process's farm worker (``celery -A farm.worker``, ``farm worker``),
    once the broker took this worker's credentials (a refusal ends the process, saying so:
    ``farm.worker.startup``; checked here, before Celery, which would retry it for ever).
    ``early``: checked once the sandbox's start is under way, which takes a generation from
    the broker first, so refused credentials stop it before it makes a container.
    ``settings``: the process's, when its caller has read them (~5 ms a read)."""
    if early in _APPS:
        return _APPS[early]
    settings = settings or FarmSettings()
    if not early:
        check_broker(settings, settings.worker_name)
    app = make_worker_app(settings, early=early)
    if early:
        check_broker(settings, settings.worker_name)
    _APPS[early] = app
    return app
