"""Process facts shared by the parts that manage local processes (sandboxes, local farms)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a process we may not signal counts; a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:  # no /proc here: trust the signal check
        return True


def die_with_parent() -> None:
    """``preexec_fn`` for children that must not outlive us (Linux ``PR_SET_PDEATHSIG``).

    A local farm's workers and redis get SIGTERM when the process that started them dies,
    even by SIGKILL, so they shut down (removing their sandboxes) instead of running orphaned.
    Start them with ``popen_tied``: Linux ties the signal to the *thread* that forked.
    The child starts with no signal blocked: a fork keeps the forking thread's mask, and
    ``farm up`` blocks SIGTERM and SIGINT to wait for them, which left its workers and redis
    deaf to that SIGTERM and to ``farm down`` (killed after a 20 s wait instead).
    """
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


# One thread that lives as long as this process and forks every tied child: Linux sends
# PR_SET_PDEATHSIG when the thread that forked a child exits, so a farm started from a
# short-lived thread (asyncio.to_thread, a pool's worker) would lose its redis and workers the
# moment that thread ended.
_launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="farm-launcher")


def popen_tied(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` of a child that dies with this process (``die_with_parent``),
    forked from the launcher thread whatever thread calls this."""
    return popen_tied_soon(args, **kwargs).result()


def popen_tied_soon(args: list[str], **kwargs: Any) -> Future[subprocess.Popen[bytes]]:
    """``popen_tied`` without waiting for the child's exec (the launcher's ``Popen`` waits
    for it): the caller goes on meanwhile."""

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(args, preexec_fn=die_with_parent, **kwargs)

    return _launcher.submit(start)
