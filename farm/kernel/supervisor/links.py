"""The supervisor's connections to the zygotes: the sandbox's own, and each box's pid 1.

A ``Link`` is one conversation (JSON datagrams, fds for spawned processes; ``zygote.py`` is the
other side): the requests it sent, each waiting for its answer within a deadline, and the
processes it started, by the pid it reports them by, until it reports their exit. A box's pid 1
knows its processes by their pids in the box, so it sends a pidfd with each, from which the
supervisor learns the pid it signals them by. When a box's pid 1 goes, every process of the box
went with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
from itertools import count
from typing import Any, TypeVar, Union

from ..boxes.box_protocol import (
    Exited,
    Listen,
    Listening,
    MakeBox,
    Recycle,
    Reset,
    Spawn,
    Spawned,
    StartCommand,
    ZygoteReport,
    send_request,
)
from .commands import CommandRun
from .session_process import SessionProcess

SPAWN_TIMEOUT_S = 10.0  # a process (or a box) started, a proxy endpoint made
RESET_TIMEOUT_S = 30.0  # a box's reset waits this long for its processes to die
request_ids = count(1)  # of the requests answered by id: reset, recycle, listen
T = TypeVar("T")

# The pid a process that ended before it was known is held by: above the kernel's limit on
# pids (PID_MAX_LIMIT, 2**22), so no signal to it, its group or its tree reaches anything.
GONE = 1 << 30


class RequestError(Exception):
    """A request the kernel refuses; ``code`` travels in the error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class BoxInit:
    """A box's pid 1 as the supervisor sees it: its exit is the end of the whole box."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)  # never a pid reused by another process
        self.disk_mb = 0  # the size of the box's disk (a kept box serves boxes of that size)
        self.exit: Exited | None = None
        self.exited = asyncio.Event()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


Process = Union[SessionProcess, CommandRun, BoxInit]


class Link:
    """One zygote the supervisor talks to (the sandbox's, or a box's pid 1): requests waiting
    for their answer, and its processes by the pid it reports them by (a box's pid 1 knows
    them by their pids in the box; ``pid`` of each is the sandbox's, from its pidfd)."""

    def __init__(self, sock: socket.socket, in_box: bool) -> None:
        self.sock = sock
        self.in_box = in_box
        self.alive = True
        self.pending: list[asyncio.Future[tuple[int, int, list[int]]]] = []
        self.resets: dict[int, asyncio.Future[bool]] = {}
        self.endpoints: dict[int, asyncio.Future[tuple[int, socket.socket]]] = {}
        self.by_pid: dict[int, Process] = {}
        # Exits reported for a process forked but not registered yet (a command that ends at
        # once: "spawned" and "exited" arrive in one read), kept for ``register``.
        self.starting: set[int] = set()
        self.early_exits: dict[int, Exited] = {}
        self.loop = asyncio.get_running_loop()
        sock.setblocking(False)

    def register(self, key: int, proc: Process) -> None:
        """Watch the exit of the process reported as ``key``, which may have come already."""
        self.starting.discard(key)
        early = self.early_exits.pop(key, None)
        if early is None:
            self.by_pid[key] = proc
        else:
            proc.exit = early
            proc.exited.set()

    async def fork(self, request: MakeBox | Spawn | StartCommand) -> tuple[int, int, list[int]]:
        """Ask this zygote to fork (a box, a session process or a command): the pid it reports
        the process by, its pid here, and its fds."""
        if not self.alive:
            raise RequestError("unavailable", "the kernel cannot start processes (zygote gone)")
        future: asyncio.Future[tuple[int, int, list[int]]] = self.loop.create_future()
        self.pending.append(future)
        try:
            send_request(self.sock, request)
        except OSError as exc:  # not sent (its queue is full): no answer will come for it
            self.pending.remove(future)
            raise RequestError("unavailable", f"the zygote took no request: {exc}") from None
        return await asyncio.wait_for(future, SPAWN_TIMEOUT_S)

    async def reset(self, request: Reset | Recycle) -> bool:
        """Send a ``reset`` or ``recycle`` (its ``id`` from ``request_ids``) and wait for its
        ``reset_done``: whether the box is as it should be."""
        return await self._answer(request, self.resets, RESET_TIMEOUT_S)

    async def listen(self) -> tuple[int, socket.socket]:
        """A proxy endpoint made by this box's pid 1: its port and listening socket."""
        request: Listen = {"op": "listen", "id": next(request_ids)}
        return await self._answer(request, self.endpoints, SPAWN_TIMEOUT_S)

    async def _answer(
        self, request: Reset | Recycle | Listen, by_id: dict[int, asyncio.Future[T]], wait_s: float
    ) -> T:
        """Send ``request`` and wait for the answer ``receive`` gives its id in ``by_id``."""
        future: asyncio.Future[T] = self.loop.create_future()
        by_id[request["id"]] = future
        try:
            send_request(self.sock, request)
            return await asyncio.wait_for(future, wait_s)
        finally:
            by_id.pop(request["id"], None)

    def receive(self) -> bool:
        """Handle what arrived; ``False`` once the other side is gone (every waiter then
        hears ``unavailable``)."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 4096, 4)
            except BlockingIOError:
                return True
            except OSError:
                data, fds = b"", []
            if not data:
                self.alive = False
                gone = RequestError("unavailable", "the zygote is gone")
                waiting: list[asyncio.Future[Any]] = [
                    *self.pending,
                    *self.resets.values(),
                    *self.endpoints.values(),
                ]
                for future in waiting:
                    if not future.done():
                        future.set_exception(gone)
                if self.in_box:  # its init is gone, and with it every process of the box
                    for pid, lost in self.by_pid.items():
                        lost.exit = {"op": "exited", "pid": pid, "signal": signal.SIGKILL}
                        lost.exited.set()
                    self.by_pid.clear()
                for fd in fds:
                    os.close(fd)
                return False
            report: ZygoteReport = json.loads(data)
            if report["op"] == "spawned":
                self._spawned(report, fds)
            elif report["op"] == "exited":
                proc = self.by_pid.pop(report["pid"], None)
                if proc is not None:
                    proc.exit = report
                    proc.exited.set()
                elif report["pid"] in self.starting:
                    self.early_exits[report["pid"]] = report
            elif report["op"] == "listening":
                self._endpoint(report, fds)
            elif report["op"] == "reset_done":
                done = self.resets.pop(report["id"], None)
                if done is not None and not done.done():
                    done.set_result(bool(report["ok"]))

    def _spawned(self, report: Spawned, fds: list[int]) -> None:
        """A process started (its fds), or why not: the answer to the oldest ``fork``."""
        future = self.pending.pop(0)  # answers come in the order of the requests
        pid = key = report["pid"]
        error = report.get("error")
        if self.in_box and key > 0:  # the last fd is the process's pidfd
            pidfd = fds.pop()
            try:  # None: it ran and ended before this read (its exit comes too)
                pid = pidfd_pid(pidfd) or GONE
            except OSError as exc:
                key, error = -1, str(exc)  # its other fds close below
            finally:
                os.close(pidfd)
        if future.done() or key < 0:  # an asker that gave up (a timeout), or a failure:
            for fd in fds:  # the fds are nobody's, and closing them ends what they
                os.close(fd)  # belonged to (EOF, no reader)
            if not future.done():
                why = error or "out of processes?"
                future.set_exception(
                    RequestError("unavailable", f"the kernel could not fork: {why}")
                )
        else:
            self.starting.add(key)
            future.set_result((key, pid, fds))

    def _endpoint(self, report: Listening, fds: list[int]) -> None:
        """A box's proxy endpoint (a listening socket, ``egress.listen``), or why not."""
        endpoint = self.endpoints.pop(report["id"], None)
        if endpoint is None or endpoint.done() or not fds:
            for fd in fds:  # nobody waits for it (a timeout): closing it ends the endpoint
                os.close(fd)
            if endpoint is not None and not endpoint.done():
                why = report.get("error") or "no socket came"
                endpoint.set_exception(RequestError("unavailable", f"no proxy endpoint: {why}"))
            return
        for extra in fds[1:]:  # one socket is all a box's pid 1 sends
            os.close(extra)
        endpoint.set_result((int(report["port"]), socket.socket(fileno=fds[0])))

    def close(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.sock.close()


def pidfd_pid(pidfd: int) -> int | None:
    """The pid, in this process's pid namespace, of the process ``pidfd`` refers to; ``None``
    when it has ended already (a command that exits at once may be reaped by its box's init
    before the supervisor reads this)."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        for line in f:
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                return pid if pid > 0 else None  # -1: it has exited
    raise OSError(f"pidfd {pidfd}: no Pid in its fdinfo")
