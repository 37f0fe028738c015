"""Process facts shared by the parts that manage local processes (sandboxes, local farms)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal


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
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
