"""``check_broker``: a worker the broker refuses ends at its start, saying so.

A broker that refuses the worker's credentials (a wrong password after a rotation, an ACL user
without farm's rights, a TLS certificate it does not trust) ends the worker at start, with one
error line and exit status ``EXIT_REFUSED``. Celery would take the refusal for an outage and
retry it for hours ("Cannot connect ... Trying again"), and an orchestrator would show a
running worker that serves nothing. A broker that is only down is left to Celery, which waits
for it: an outage ends by itself, a refusal does not. ``farm.worker.tasks.worker_app`` runs it
before Celery starts, whichever command started the worker.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from farm.settings import FarmSettings

log = logging.getLogger(__name__)

EXIT_REFUSED = 78  # EX_CONFIG (sysexits.h): fix the configuration; restarting will not help


def check_broker(settings: FarmSettings, worker: str) -> None:
    """Exit (``EXIT_REFUSED``) when the broker refuses this worker, with one error line that
    names the broker (its URL without the password) and what to fix; return when it accepts
    the worker or cannot be reached at all (Celery waits for it). The refusal is told apart
    from an outage where every farm client tells it: ``farm.broker_errors.refusal``. Asks what
    a worker's start does first, reading the broker's mark (farm's keys, so an ACL user
    without them is refused too)."""
    from kombu.utils.url import maybe_sanitize_url

    from farm.broker_errors import REFUSED, refusal
    from farm.registry import Registry

    registry = Registry.connect(settings)
    try:
        registry.broker_mark()
    except REFUSED as exc:
        given = urlsplit(settings.redis_url).password is not None
        refused = refusal(exc, maybe_sanitize_url(settings.broker_url), password=given)
        if refused is None:  # down or unreachable: an outage, which Celery waits out
            return
        if not logging.getLogger().handlers:  # before Celery set up logging (celery -A ...)
            logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s %(message)s")
        log.error("farm worker %s cannot start: %s: %s", worker, type(refused).__name__, refused)
        raise SystemExit(EXIT_REFUSED) from None
    finally:
        registry.close()
