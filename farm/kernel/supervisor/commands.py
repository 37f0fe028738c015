"""Commands in a box: any program of the image (``node``, ``gcc``, ``sh -c ...``), beside the
Python REPL, each in a process of its own, concurrent with the session's cells.

Invariants: the result says what happened (``returncode``, 128 + N for signal N, 127/126 when
it cannot run, ``timed_out``); a command that ends normally leaves its background children
running; a timeout kills only the command's tree (its keeper's descendants, each through a
pidfd). Why the keeper, and what it costs: docs/design/commands.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from ..boxes.box_protocol import Exited
from ..boxes.trees import kill_tree
from .output import CappedBuffer, drain_into

DRAIN_S = 0.2  # after the command exits, how long output still held by its children is read
KILL_WAIT_S = 5.0


class CommandRun:
    """One running command, as the supervisor sees it (``exit``/``exited`` like a session
    process: the zygote reports its death)."""

    def __init__(self, pid: int, stdin_fd: int, out_fd: int, err_fd: int, cap: int) -> None:
        self.pid = pid
        self.stdin_fd = stdin_fd
        self.fds = {out_fd: CappedBuffer(cap), err_fd: CappedBuffer(cap)}
        self.out, self.err = self.fds[out_fd], self.fds[err_fd]
        self.exit: Exited | None = None
        self.exited = asyncio.Event()
        self.open = set(self.fds)

    async def run(self, stdin: bytes, timeout_s: float) -> dict[str, Any]:
        """Feed ``stdin``, wait for the exit (killing the tree at the timeout), read what
        it wrote; the fields of a ``CommandResult``."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        for fd in self.fds:
            os.set_blocking(fd, False)
            loop.add_reader(fd, self._drain, fd)
        feeding = asyncio.ensure_future(self._feed(stdin))
        timed_out = False
        try:
            await asyncio.wait_for(self.exited.wait(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            kill_tree(self.pid)  # its keeper and everything below it, setsid() or not
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.exited.wait(), KILL_WAIT_S)
        finally:
            feeding.cancel()
        deadline = loop.time() + DRAIN_S
        while self.open and loop.time() < deadline:
            await asyncio.sleep(0.01)  # pipes still open: children may hold them; bounded
        self.close()
        died = self.exit.get("signal") if self.exit else None
        code = self.exit.get("code") if self.exit else None
        return {
            "returncode": 128 + died if died else code,
            "signal": died,
            "timed_out": timed_out,
            "stdout": self.out.text(),
            "stderr": self.err.text(),
            "stdout_truncated": self.out.truncated,
            "stderr_truncated": self.err.truncated,
            "duration_s": time.perf_counter() - t0,
        }

    async def _feed(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin without blocking the loop, then close it (a
        command that exits without reading it all gets the rest dropped)."""
        loop = asyncio.get_running_loop()
        fd = self.stdin_fd
        try:
            os.set_blocking(fd, False)
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(fd, view[: 1 << 16]) :]
                except BlockingIOError:
                    ready = loop.create_future()
                    loop.add_writer(fd, ready.set_result, None)
                    try:
                        await ready
                    finally:
                        loop.remove_writer(fd)
        except (BrokenPipeError, OSError):
            pass  # it stopped reading
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _drain(self, fd: int) -> None:
        if not drain_into(fd, self.fds[fd]):
            asyncio.get_running_loop().remove_reader(fd)
            self.open.discard(fd)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for fd in self.fds:
            if fd in self.open:
                loop.remove_reader(fd)
                self.open.discard(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
