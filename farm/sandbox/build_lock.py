"""One lock between image builds and image removals on this Docker host.

Removing an image also removes its untagged parents, which a build running at the same time
(another checkout, another test process) may be using as its layer cache or has just committed
as a step: that build then fails with "unable to find image sha256:...". Builds hold the lock
shared; a removal takes it exclusive, and skips (or waits, when told to) while any build runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = Path(tempfile.gettempdir()) / "farm-image-builds.lock"
POLL_S = 0.2  # how often a waiting removal looks again


def _open() -> int:
    return os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)


@contextlib.contextmanager
def building() -> Iterator[None]:
    """Held by a build for as long as it runs: removals wait for (or skip) it."""
    fd = _open()
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def removing(wait_s: float = 0.0) -> Iterator[bool]:
    """Yields whether no build runs now (then none starts until the block ends); waits up to
    ``wait_s`` for running builds to end before yielding False."""
    fd = _open()
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    held = False
                    break
                time.sleep(POLL_S)  # poll interval of the deadline-bounded lock wait
        yield held
    finally:
        os.close(fd)
