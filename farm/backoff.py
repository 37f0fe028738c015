"""Exponential backoff, the one schedule of every retry loop in farm (the broker waiting out an
outage, the keeper replacing a sandbox, a client asking for room to open a session).

``delays`` yields the pauses; each caller waits them its own way (``time.sleep``, a stop
event's ``wait``), always bounded by its own deadline.
"""

from __future__ import annotations

from collections.abc import Iterator


def delays(first: float, cap: float, factor: float = 2.0) -> Iterator[float]:
    """``first``, ``first * factor``, ... never more than ``cap``; endless."""
    delay = first
    while True:
        yield delay
        delay = min(delay * factor, cap)
