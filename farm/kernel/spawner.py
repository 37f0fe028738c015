"""``Spawner``: the supervisor's side of the zygote — processes into boxes, signals, resets.

The supervisor (the kernel's asyncio process) never forks: it asks the zygote
(``zygote.py``), whose children do each privileged step, to start processes in boxes and to
empty what the supervisor's own kill (CAP_KILL, through pidfds) and search could not. This
keeps the conversation (JSON datagrams, fds for spawned processes) and the box pool
(``boxes.BoxPool``) in one place:

- ``spawn(box, tools)`` starts a session process in a box and returns once the process said it
  is ready (a process that could not enter its box is an error here, not at its first cell);
- ``reset(box, proc, remove=...)`` kills every process of the box and, when the box ends,
  every file of it; ``end_box`` does that in the background and gives the number back only
  when it succeeded (a failed reset quarantines the box);
- ``SPARES`` processes with default limits are kept ready, so that opening a session usually
  costs no fork at all: the zygote forks the next spare while nothing waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Coroutine, Iterator
from itertools import count
from typing import Any, Generic, TypeVar

from . import leftovers, procs
from .boxes import Box, BoxPool, Caps
from .commands import CommandRun
from .framing import FrameError, read_frame
from .process import SessionProcess
from .protocol import BoxLimits
from .zygote import send_request

log = logging.getLogger("farm.kernel")
_ids = count(1)

SPAWN_TIMEOUT_S = 10.0
SPARES = 2  # session processes kept ready for the next opens
RESET_TIMEOUT_S = 30.0  # a box's reset waits this long for its processes to die
QUARANTINE_RETRY_S = 5.0  # a box that would not reset is tried again after this, doubling
COALESCE_S = 0.002  # boxes that end this close together share one look at /proc and the files
KILL_S = 1.0  # the supervisor's own kill of a box's processes; past it, a helper does it


class RequestError(Exception):
    """A request the kernel refuses; ``code`` travels in the error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


K = TypeVar("K")
A = TypeVar("A")
R = TypeVar("R")


class Coalesce(Generic[K, A, R]):
    """``await ask(key, arg)``: the answer for ``key`` of one ``work({key: arg, ...})`` call made
    for every ask within ``COALESCE_S``. For work whose cost is the same for one key as for
    many (a pass over ``/proc``, a listing of the shared directories): what a box's end costs
    then no longer grows with the number of boxes that end at once."""

    def __init__(self, work: Callable[[dict[K, A]], dict[K, R]]) -> None:
        self.work = work
        self.loop = asyncio.get_running_loop()
        self.asked: dict[K, A] = {}
        self.waiting: list[tuple[K, asyncio.Future[R]]] = []

    async def ask(self, key: K, arg: A) -> R:
        future: asyncio.Future[R] = self.loop.create_future()
        if not self.waiting:
            self.loop.call_later(COALESCE_S, self._run)
        self.asked[key] = arg
        self.waiting.append((key, future))
        return await future

    def _run(self) -> None:
        asked, waiting = self.asked, self.waiting
        self.asked, self.waiting = {}, []
        try:
            answers = self.work(asked)
        except Exception as exc:  # each asker hears of it, none waits forever
            for _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        for key, future in waiting:
            if not future.done():
                future.set_result(answers[key])


class Spawner:
    def __init__(self, zygote: socket.socket, pool: BoxPool, caps: Caps, tool_limit: int) -> None:
        self.zygote = zygote
        self.pool = pool
        self.caps = caps
        self.tool_limit = tool_limit
        self.by_pid: dict[int, SessionProcess | CommandRun] = {}
        # Exits the zygote reported for a process forked but not registered yet (a command
        # that ends at once: "spawned" and "exited" arrive in one read), kept for _register.
        self.starting: set[int] = set()
        self.early_exits: dict[int, dict[str, Any]] = {}
        self.groups: dict[int, set[int]] = {}  # box number -> process groups of its commands
        # box number -> processes being started for it, not yet in its uid (or its groups): a
        # reset waits for them, so its kill finds them and no box is given back with one
        self.forking: dict[int, int] = {}
        self.pending: list[asyncio.Future[tuple[int, list[int]]]] = []
        self.resets: dict[int, asyncio.Future[bool]] = {}
        self.spares: list[tuple[Box, SessionProcess]] = []  # ready processes, no session yet
        self.refilling = 0
        self.closing = False
        self._background: set[asyncio.Task[None]] = set()
        self.loop = asyncio.get_running_loop()
        # Boxes end in bursts (a chunk's items end together): one look at /proc, and one search
        # of the shared directories, serves every box that ends within a few milliseconds.
        self.kills: Coalesce[int, None, int] = Coalesce(procs.kill_uids)
        self.checks: Coalesce[int, dict[str, Any], bool] = Coalesce(
            lambda boxes: dict(
                zip(boxes, leftovers.nothing_left_all(list(boxes.values()), pool.isolation))
            )
        )
        zygote.setblocking(False)
        self.loop.add_reader(zygote, self._on_zygote)
        self.zygote_alive = True
        # Set when the zygote dies: its sessions died with it (PDEATHSIG) and no new one can
        # start, so the kernel stops and its sandbox is replaced (``serve_forever``).
        self.zygote_lost = asyncio.Event()
        self.loop.call_soon(self.refill)

    def _on_zygote(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.zygote, 4096, 3)
            except BlockingIOError:
                return
            if not data:
                self.zygote_alive = False
                self.loop.remove_reader(self.zygote)
                log.error("the zygote exited; no new sessions can start")
                self.zygote_lost.set()
                gone = RequestError("unavailable", "the zygote is gone")
                waiting: list[asyncio.Future[Any]] = [*self.pending, *self.resets.values()]
                for future in waiting:
                    if not future.done():
                        future.set_exception(gone)
                return
            message = json.loads(data)
            if message["op"] == "spawned":
                self.starting.add(message["pid"])
                self.pending.pop(0).set_result((message["pid"], fds))
            elif message["op"] == "exited":
                proc = self.by_pid.pop(message["pid"], None)
                if proc is not None:
                    proc.exit = message
                    proc.exited.set()
                elif message["pid"] in self.starting:
                    self.early_exits[message["pid"]] = message
            elif message["op"] == "reset_done":
                done = self.resets.pop(message["id"], None)
                if done is not None and not done.done():
                    done.set_result(bool(message["ok"]))

    def _to_zygote(self, message: dict[str, Any]) -> None:
        if not self.zygote_alive:
            raise RequestError("unavailable", "the kernel cannot start sessions (zygote gone)")
        send_request(self.zygote, message)

    async def spawn(self, box: Box, tools: bool) -> SessionProcess:
        """A new session process in ``box``, once it said it is ready (in its box)."""
        with self._starting(box):
            return await self._spawn(box, tools)

    @contextlib.contextmanager
    def _starting(self, box: Box) -> Iterator[None]:
        self.forking[box.number] = self.forking.get(box.number, 0) + 1
        try:
            yield
        finally:
            self.forking[box.number] -= 1
            if not self.forking[box.number]:
                del self.forking[box.number]

    async def _spawn(self, box: Box, tools: bool) -> SessionProcess:
        config = {"tools": tools, "tool_limit": self.tool_limit, "box": box.describe()}
        pid, fds = await self._forked({"op": "spawn", "session": config})
        proc = SessionProcess(pid, socket.socket(fileno=fds[0]), fds[1], fds[2])
        self._register(pid, proc)
        await proc.attach(self.loop)
        try:
            ready = await asyncio.wait_for(read_frame(proc.reader), SPAWN_TIMEOUT_S)
        except (asyncio.TimeoutError, FrameError, ConnectionError, OSError):
            ready = None
        if ready is None or ready.get("type") != "ready":
            for fd in proc.fds:
                proc.drain(fd)
            why = proc.err.text().strip()[-2000:] or "no reason given"
            proc.close(self.loop)
            await self.reset(box, proc, remove=False)
            raise RequestError("unavailable", f"the session process could not start: {why}")
        return proc

    async def command(self, box: Box, request: dict[str, Any], cap: int) -> CommandRun:
        """Start a command in ``box`` (``commands.py``); it runs as soon as this returns."""
        fields = ("argv", "cwd", "env", "stdin_path")
        message = {"op": "command", "box": box.describe(), **{k: request.get(k) for k in fields}}
        with self._starting(box):  # until its group is known: a reset kills it by its group
            pid, fds = await self._forked(message)
            run = CommandRun(pid, fds[0], fds[1], fds[2], cap)
            self._register(pid, run)
            self.groups.setdefault(box.number, set()).add(pid)  # its own group (setsid)
        return run

    def _register(self, pid: int, proc: SessionProcess | CommandRun) -> None:
        """Watch ``pid``'s exit, which the zygote may have reported already."""
        self.starting.discard(pid)
        early = self.early_exits.pop(pid, None)
        if early is None:
            self.by_pid[pid] = proc
        else:
            proc.exit = early
            proc.exited.set()

    async def _forked(self, message: dict[str, Any]) -> tuple[int, list[int]]:
        """Ask the zygote to fork (a session process or a command): its pid and fds."""
        if not self.zygote_alive:
            raise RequestError("unavailable", "the kernel cannot start processes (zygote gone)")
        future: asyncio.Future[tuple[int, list[int]]] = self.loop.create_future()
        self.pending.append(future)
        send_request(self.zygote, message)
        pid, fds = await asyncio.wait_for(future, SPAWN_TIMEOUT_S)
        if pid < 0:
            raise RequestError("unavailable", "the kernel could not fork (out of processes?)")
        return pid, fds

    async def reset(self, box: Box, proc: SessionProcess | None, *, remove: bool) -> bool:
        """Kill every process of ``box`` (and, with ``remove``, every file of it); ``True``
        once done, ``False`` when something would not go. It first waits for the processes
        being started for the box (they would be missed). The common case costs no fork: the
        supervisor kills the box's processes itself (``procs.kill_uids``, coalesced) and
        removes its two empty directories; a box that leaves files (or processes that will not
        die) gets a zygote helper that does the rest as the box's uid."""
        deadline = self.loop.time() + SPAWN_TIMEOUT_S + KILL_S
        while self.forking.get(box.number) and self.loop.time() < deadline:
            await asyncio.sleep(0.002)  # a process entering the box: poll of a deadline
        killed = await self._kill(box, proc)
        if killed and not remove:
            return True
        if killed and await self.checks.ask(box.number, box.describe()):
            try:
                for path in (box.workspace, box.tmp):
                    with contextlib.suppress(FileNotFoundError):
                        os.rmdir(path)
                return True
            except OSError:
                pass  # something appeared after all: the helper removes it
        return await self._reset_by_helper(box, proc.pid if proc else None, remove=remove)

    async def _kill(self, box: Box, proc: SessionProcess | None) -> bool:
        """Every process of the box gone (reaped) within ``KILL_S``; ``False``: not yet. The
        session process's group first (usually all there is), waiting for the zygote to reap
        it, then whatever else its uid runs (daemons that left the group)."""
        if proc is not None and proc.exit is None:
            proc.signal(signal.SIGKILL, group=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.exited.wait(), KILL_S)
        for group in self.groups.pop(box.number, set()):  # its commands, in their box or not yet
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        if self.pool.isolation == "dirs":  # one uid for all: the box's own groups go, no more
            return True
        deadline = self.loop.time() + KILL_S
        while (left := await self.kills.ask(box.uid, None)) and self.loop.time() < deadline:
            await asyncio.sleep(0.002)  # the zygote reaps them meanwhile; poll of a deadline
        return left == 0

    async def _reset_by_helper(self, box: Box, pgid: int | None, *, remove: bool) -> bool:
        request_id = next(_ids)
        future: asyncio.Future[bool] = self.loop.create_future()
        self.resets[request_id] = future
        message = {"op": "reset", "id": request_id, "box": box.describe(), "remove": remove}
        self._to_zygote({**message, "pgid": pgid})
        try:
            ok = await asyncio.wait_for(future, RESET_TIMEOUT_S)
        except (asyncio.TimeoutError, RequestError):
            ok = False
        if not ok:
            log.error("box %d (uid %d) could not be reset; it is not reused", box.number, box.uid)
        return ok

    def take_box(self, limits: BoxLimits) -> Box:
        box = self.pool.take(limits)
        if box is None:
            raise RequestError("too_many_sessions", "every box of this kernel is in use")
        return box

    def take_spare(self) -> tuple[Box, SessionProcess] | None:
        while self.spares:
            box, proc = self.spares.pop(0)
            if proc.exit is None:
                return box, proc
            proc.close(self.loop)  # it died waiting: its box goes back clean
            self.end_box(box, proc)
        return None

    def refill(self) -> None:
        """Start spare processes (default limits, tools) until ``SPARES`` are ready or on the
        way: opening then costs no fork, the zygote forks them while nothing waits."""
        while len(self.spares) + self.refilling < SPARES and self.zygote_alive:
            box = self.pool.take(self.caps.defaults())
            if box is None:
                return
            self.refilling += 1
            self._in_background(self._make_spare(box))

    async def _make_spare(self, box: Box) -> None:
        try:
            proc = await self.spawn(box, True)
        except (RequestError, asyncio.TimeoutError) as exc:
            log.warning("a spare session process could not start: %s", exc)
            self.end_box(box, None)
            return
        finally:
            self.refilling -= 1
        if self.closing:
            proc.close(self.loop)
            self.end_box(box, proc)
        else:
            self.spares.append((box, proc))

    def end_box(self, box: Box, proc: SessionProcess | None) -> None:
        async def reset_then_give_back() -> None:
            try:
                clean = await self.reset(box, proc, remove=True)
            except Exception:  # e.g. out of fds for pidfds: not reused, never lost unsaid
                log.exception("box %d (uid %d) could not be reset", box.number, box.uid)
                clean = False
            self.pool.give_back(box, clean=clean)
            if not clean:
                self._retry(box, QUARANTINE_RETRY_S)

        self._in_background(reset_then_give_back())

    def _retry(self, box: Box, after_s: float) -> None:
        """Reset a quarantined box again after ``after_s`` (doubling, up to ten minutes): what
        kept it (a file of its uid in a neighbour's directory it could not empty) may go with
        that neighbour's end; until then its number stays out of use."""

        async def again() -> None:
            clean = await self._reset_by_helper(box, None, remove=True)
            self.pool.give_back(box, clean=clean)
            if clean:
                log.info("box %d (uid %d) is clean again", box.number, box.uid)
            else:
                self._retry(box, min(after_s * 2, 600.0))

        if not self.closing:
            self.loop.call_later(after_s, lambda: self._in_background(again()))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def close(self) -> None:
        """No more spares; the ready ones end (their boxes are reset)."""
        self.closing = True
        while self.spares:
            box, proc = self.spares.pop()
            proc.close(self.loop)
            self.end_box(box, proc)
