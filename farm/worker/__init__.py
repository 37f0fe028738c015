"""The farm worker: a Celery worker that owns exactly one sandbox (``celery -A farm.worker``)."""

from farm.worker.app import app

__all__ = ["app"]
