"""The farm worker: a Celery worker that owns exactly one sandbox (``celery -A farm.worker``).

Importing it builds nothing; ``farm.worker.app`` builds the Celery app on first use.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from farm.worker.tasks import worker_app

        return worker_app()
    raise AttributeError(f"module 'farm.worker' has no attribute {name!r}")
