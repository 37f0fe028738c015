"""The tests' one way to wait: poll a real signal until a deadline, never sleep to get somewhere.

``wait_for`` returns as soon as the state is reached (``False`` at the deadline, for the caller
to assert with its own message); ``stays`` is the bounded poll that shows a state holds for a
while, where a test must show that something did *not* happen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.05) -> T:
    """``predicate()``'s first truthy value within ``timeout_s``, else its last (falsy) one."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)  # poll interval of the deadline-bounded wait


def stays(predicate: Callable[[], object], duration_s: float, interval_s: float = 0.05) -> bool:
    """Whether ``predicate()`` holds at every poll for ``duration_s`` (False at the first miss)."""
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(interval_s)  # sampling interval of the bounded observation
    return bool(predicate())
