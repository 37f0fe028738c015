"""Commands in a box: any program of the image (``node``, ``gcc``, ``sh -c ...``), beside the
Python REPL, each in a process of its own.

A command is forked by the zygote into the session's box (its uid, limits and workspace, like
the session process) in a process group of its own, and ``execve``s its argv directly (a
string command is ``/bin/sh -c`` in the client). It never waits for the REPL: commands of one
session run concurrently with each other and with its cells. The supervisor (``CommandRun``)
feeds its stdin (bytes sent with the request, or a file staged in the box, opened as the box),
captures stdout and stderr separately with the same head+tail caps as cells, and enforces the
timeout by killing the command's whole process group.

Invariants:
- the result says what happened: ``returncode`` is the exit status, or 128 + N for a death by
  signal N (``signal`` says N), as shells report it; ``timed_out`` when the timeout killed it;
  a program that cannot be run is 127 (not found) or 126 (not executable, bad cwd), with the
  reason on stderr;
- a command that ends normally leaves its background children running (they end with the box);
  their hold on the output pipes is not waited for beyond ``DRAIN_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from .output import CappedBuffer, drain_into

DRAIN_S = 0.2  # after the command exits, how long output still held by its children is read
KILL_WAIT_S = 5.0


def exec_in_box(request: dict[str, Any]) -> None:
    """In the zygote's child, already in the box: become the command (returns only on failure,
    having written why to stderr; the caller exits with ``os._exit(code)``)."""
    argv: list[str] = request["argv"]
    staged = request.get("stdin_path")
    if staged:  # relative to the workspace (the cwd here), as the box: only what it may read
        fd = os.open(staged, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(staged)
    cwd = request.get("cwd")
    if cwd:
        try:
            os.chdir(os.path.join(os.getcwd(), cwd))
        except OSError as exc:
            os.write(2, f"farm: cannot change to cwd {cwd!r}: {exc.strerror}\n".encode())
            os._exit(126)
    os.environ.update(request.get("env") or {})
    try:
        os.execvpe(argv[0], argv, os.environ)
    except FileNotFoundError:
        os.write(2, f"farm: {argv[0]}: command not found\n".encode())
        os._exit(127)
    except OSError as exc:  # not executable, argv/env past Linux's limits (E2BIG), ...
        os.write(2, f"farm: {argv[0]}: {exc.strerror}\n".encode())
        os._exit(126)


class CommandRun:
    """One running command, as the supervisor sees it (``exit``/``exited`` like a session
    process: the zygote reports its death)."""

    def __init__(self, pid: int, stdin_fd: int, out_fd: int, err_fd: int, cap: int) -> None:
        self.pid = pid
        self.stdin_fd = stdin_fd
        self.fds = {out_fd: CappedBuffer(cap), err_fd: CappedBuffer(cap)}
        self.out, self.err = self.fds[out_fd], self.fds[err_fd]
        self.exit: dict[str, Any] | None = None
        self.exited = asyncio.Event()
        self.open = set(self.fds)

    async def run(self, stdin: bytes, timeout_s: float) -> dict[str, Any]:
        """Feed ``stdin``, wait for the exit (killing the group at the timeout), read what
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
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)  # the whole tree it started in its group
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.exited.wait(), KILL_WAIT_S)
        finally:
            feeding.cancel()
        deadline = loop.time() + DRAIN_S
        while self.open and loop.time() < deadline:
            await asyncio.sleep(0.01)  # pipes still open: children may hold them; bounded
        self.close()
        died = (self.exit or {}).get("signal")
        code = (self.exit or {}).get("code")
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
