"""``python -m farm.worker``: start one farm worker (what ``farm worker`` runs).

A threads pool, because a worker's calls wait on its one sandbox's kernel (I/O), and one
process keeps one sandbox, one registry entry and one metrics endpoint.

A broker that refuses the worker's credentials ends it at start, saying so: ``worker_app()``
checks (``farm.worker.startup.check_broker``), so ``celery -A farm.worker worker`` does too.
"""

from __future__ import annotations

import logging
import sys

from farm.settings import FarmSettings


def main(argv: list[str] | None = None) -> None:
    settings = FarmSettings()
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    name = settings.worker_name  # = Worker.id

    from farm.worker.tasks import worker_app

    app = worker_app(early=True)  # its sandbox starts while Celery sets up

    args = [
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        str(settings.worker_threads),
        "--hostname",
        f"{name}@%h",
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        "INFO",
        *(argv if argv is not None else sys.argv[1:]),
    ]
    app.worker_main(args)


if __name__ == "__main__":
    main()
