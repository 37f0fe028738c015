"""A session as the supervisor holds it: its box, its process, its epoch, its lock, its proxy
endpoint; and the cgroup's OOM-kill counter that tells a memory kill from another SIGKILL.

Invariants: a closed session's endpoint is shut down for every holder (``revoke``) before its
box is reset; a session's memory kills are recorded for the cell that caused them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time

from ..boxes.pool import Box
from .memwatch import Watched
from .session_process import SessionProcess

_OOM_EVENT_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


class OomCounter:
    """The cgroup's OOM-kill counter, to tell a memory kill from any other SIGKILL. Read once
    per cell: the file is opened once and read again with ``pread`` (a cgroup file is made
    afresh at offset 0), one system call instead of an open, a text layer and a close."""

    def __init__(self, paths: tuple[str, ...] = _OOM_EVENT_FILES) -> None:
        self.fd: int | None = None
        for path in paths:  # the first that has the counter (an old memory.events has not)
            with contextlib.suppress(OSError):
                self.fd = os.open(path, os.O_RDONLY)
                if self.read() is not None:
                    return
                self.close()

    def read(self) -> int | None:
        if self.fd is None:
            return None
        try:
            data = os.pread(self.fd, 4096, 0)
        except OSError:
            return None
        for line in data.split(b"\n"):
            key, _, value = line.partition(b" ")
            if key == b"oom_kill":
                with contextlib.suppress(ValueError):
                    return int(value)
        return None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Session:
    def __init__(self, session_id: str, box: Box, tools: bool) -> None:
        self.id = session_id
        self.box = box
        self.tools = tools
        self.epoch = 1
        self.proc: SessionProcess
        self.lock = asyncio.Lock()
        self.last_used = time.monotonic()
        self.memory_kills: list[tuple[int, int, int, int]] = []  # MemoryWatch: pid, kB, of kB
        self.endpoint: socket.socket | None = None  # its proxy endpoint (egress), if any
        self.closed = False  # closed: whatever starts for it now must not outlive its box
        self.one_shot = False  # an item's: closed right after its last step, never replaced

    def watched(self) -> Watched | None:
        """The box as the memory watch holds it to its budget (none without one)."""
        budget = self.box.limits.get("memory_mb")
        if not budget or self.proc.exit is not None:
            return None
        return Watched(self.box.uid, budget * 1024, self.proc.pid, self._killed)

    def _killed(self, pid: int, kb: int, total_kb: int, budget_kb: int) -> None:
        self.memory_kills.append((pid, kb, total_kb, budget_kb))


def revoke(session: Session) -> None:
    """End the session's proxy endpoint for every holder of it (the host's proxy too): shut
    down, it listens no more, so no later tenant of the box can reach this session's policy."""
    if session.endpoint is not None:
        with contextlib.suppress(OSError):
            session.endpoint.shutdown(socket.SHUT_RDWR)
        session.endpoint.close()
        session.endpoint = None
