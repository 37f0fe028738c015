"""``python -m farm.worker``: start one farm worker (what ``farm worker`` runs).

A threads pool, because a worker's calls wait on its one sandbox's kernel (I/O), and one
process keeps one sandbox, one registry entry and one metrics endpoint.

A broker that refuses the worker's credentials ends it at start, saying so: ``worker_app()``
checks (``farm.worker.startup.check_broker``), so ``celery -A farm.worker worker`` does too.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from farm.settings import FarmSettings


def main(argv: list[str] | None = None) -> None:
    """Start the worker; ``argv`` (default: this process's arguments), when any, are more of
    Celery's own ``worker`` options, and go through Celery's command line."""
    settings = FarmSettings()
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    name = settings.worker_name  # = Worker.id

    from farm.worker.tasks import worker_app

    app = worker_app(early=True, settings=settings)  # its sandbox starts while Celery sets up
    options = worker_options(name, settings.worker_threads)
    extra = argv if argv is not None else sys.argv[1:]
    if extra:  # Celery's own worker options: its command line parses them
        app.worker_main(["worker", *command_line(options), *extra])
        return
    sys.exit(run_worker(app, options))


def worker_options(name: str, threads: int) -> dict[str, Any]:
    """The options of a farm worker, as Celery's ``worker`` command names them."""
    return {
        "pool": "threads",
        "concurrency": threads,
        "hostname": f"{name}@%h",
        "without_gossip": True,
        "without_mingle": True,
        "loglevel": "INFO",
    }


def command_line(options: dict[str, Any]) -> list[str]:
    """``options`` as arguments of Celery's ``worker`` command."""
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def run_worker(app: Any, options: dict[str, Any]) -> int:
    """What Celery's ``worker`` command does with ``options``, without loading its command
    line (click, click-repl, prompt_toolkit: ~80 ms of every worker's start): the worker's
    exit code."""
    from celery import concurrency
    from celery.utils.nodenames import default_nodename, host_format

    given = dict(options)
    worker = app.Worker(
        hostname=host_format(default_nodename(given.pop("hostname"))),
        pool_cls=concurrency.get_implementation(given.pop("pool")),
        **given,
    )
    worker.start()
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    main()
