"""``Spawner``: the supervisor's side of the zygotes — processes in boxes, resets, spares.

The supervisor never forks: it asks each box's pid 1 (``box_inits``; the zygote itself with
``uids``) to start processes in the box, over a ``Link``. ``spawn`` returns only once the
process is ready; a box's number goes back only once nothing of the box is left; ``SPARES``
ready processes make opening a session usually cost no fork. Design: docs/design/boxes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections import deque
from collections.abc import Coroutine, Iterator
from typing import Any

from ..boxes import leftovers, procs
from ..boxes.box_protocol import BoxInfo, Reset, SessionConfig, StartCommand
from ..boxes.pool import Box, BoxPool, Caps
from ..wire.framing import FrameError, read_frame
from ..wire.protocol import BoxLimits, Capacity, JudgeSpec
from .admission import Admission
from .box_inits import BoxInits
from .coalesce import Coalesce
from .commands import CommandRun
from .links import SPAWN_TIMEOUT_S, Link, RequestError, request_ids
from .session_process import SessionProcess

log = logging.getLogger("farm.kernel")

SPARES = 2  # session processes kept ready for the next opens
Spare = tuple[Box, SessionProcess]  # a ready process and its box
QUARANTINE_RETRY_S = 5.0  # a box that would not reset is tried again after this, doubling
KILL_S = 1.0  # the supervisor's own kill of a box's processes; past it, a helper does it


class Spawner:
    def __init__(
        self,
        zygote: socket.socket,
        pool: BoxPool,
        caps: Caps,
        tool_limit: int,
        max_sessions: int = 256,
    ) -> None:
        self.zygote = Link(zygote, in_box=False)
        self.pool = pool
        self.caps = caps
        # Boxes of sessions and items: at once when they fit, else in order as boxes end.
        self.admission = Admission(pool, max_sessions, caps.defaults())
        self.admission.on_starved = self._retire_spare
        self.tool_limit = tool_limit
        self.groups: dict[int, set[int]] = {}  # box number -> process groups of its commands
        self.inits = BoxInits(self.zygote, pool, self.groups)  # boxes with namespaces
        # box number -> processes being started for it, not yet in its uid (or its groups): a
        # reset waits for them, so its kill finds them and no box is given back with one
        self.forking: dict[int, int] = {}
        self.spares: list[Spare] = []  # ready processes, no session yet
        self.refilling = 0
        self.claims: deque[asyncio.Future[Spare | None]] = deque()  # opens waiting for a spare
        self.closing = False
        self._background: set[asyncio.Task[None]] = set()
        self.loop = asyncio.get_running_loop()
        # Boxes end in bursts (a chunk's items end together): one look at /proc, and one search
        # of the shared directories, serves every box that ends within a few milliseconds.
        self.kills: Coalesce[int, None, int] = Coalesce(procs.kill_uids)
        self.checks: Coalesce[int, BoxInfo, bool] = Coalesce(
            lambda boxes: dict(
                zip(boxes, leftovers.nothing_left_all(list(boxes.values()), pool.isolation))
            )
        )
        self.loop.add_reader(zygote, self._on_zygote)
        # Set when the zygote dies: its sessions died with it (PDEATHSIG) and no new one can
        # start, so the kernel stops and its sandbox is replaced (``serve_forever``).
        self.zygote_lost = asyncio.Event()
        self.loop.call_soon(self.refill)

    @property
    def zygote_alive(self) -> bool:
        return self.zygote.alive

    def _on_zygote(self) -> None:
        if not self.zygote.receive():
            self.loop.remove_reader(self.zygote.sock)
            log.error("the zygote exited; no new sessions can start")
            self.zygote_lost.set()

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
        config: SessionConfig = {
            "tools": tools,
            "tool_limit": self.tool_limit,
            "box": box.describe(),
        }
        link = await self.inits.link(box)
        key, pid, fds = await link.fork({"op": "spawn", "session": config})
        proc = SessionProcess(pid, socket.socket(fileno=fds[0]), fds[1], fds[2])
        link.register(key, proc)
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

    async def command(
        self,
        box: Box,
        argv: list[str],
        cap: int,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin_path: str | None = None,
        judge: JudgeSpec | None = None,
    ) -> CommandRun:
        """Start ``argv`` in ``box`` under its keeper (or, with ``judge``, the judge's runner),
        each output stream capped at ``cap``; it runs as soon as this returns."""
        message: StartCommand = {
            "op": "command",
            "box": box.describe(),
            "argv": argv,
            "cwd": cwd,
            "env": env,
            "stdin_path": stdin_path,
            "judge": judge,
        }
        with self._starting(box):  # until its group is known: a reset kills it by its group
            link = await self.inits.link(box)
            key, pid, fds = await link.fork(message)
            run = CommandRun(pid, fds[0], fds[1], fds[2], cap)
            link.register(key, run)
            self.groups.setdefault(box.number, set()).add(pid)  # its own group (setsid)
        return run

    async def reset(self, box: Box, proc: SessionProcess | None, *, remove: bool) -> bool:
        """Kill every process of ``box`` (and, with ``remove``, all of the box); ``True``
        once done, ``False`` when something would not go. It first waits for the processes
        being started for the box (they would be missed). A box with namespaces is emptied by
        its pid 1 and ends with it; with ``uids`` the supervisor kills the box's processes
        itself (``procs.kill_uids``, coalesced) and removes its two empty directories, and a
        box that leaves files (or processes that will not die) gets a zygote helper that does
        the rest as the box's uid."""
        deadline = self.loop.time() + SPAWN_TIMEOUT_S + KILL_S
        while self.forking.get(box.number) and self.loop.time() < deadline:
            await asyncio.sleep(0.002)  # a process entering the box: poll of a deadline
        if self.pool.isolation == "namespaces":
            return await (self.inits.recycle(box) if remove else self.inits.empty(box))
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
        message: Reset = {
            "op": "reset",
            "id": next(request_ids),
            "box": box.describe(),
            "remove": remove,
            "pgid": pgid,
        }
        try:
            if not self.zygote.alive:
                raise RequestError("unavailable", "the zygote is gone")
            ok = await self.zygote.reset(message)
        except (asyncio.TimeoutError, RequestError):
            ok = False
        if not ok:
            log.error("box %d (uid %d) could not be reset; it is not reused", box.number, box.uid)
        return ok

    async def take_box(
        self, limits: BoxLimits, wait_s: float, gone: asyncio.Future[Any] | None = None
    ) -> Box:
        """A box for a session or an item, waiting up to ``wait_s`` for room (``admission``,
        which also gives up when ``gone``); its end is ``end_box`` then ``admission.release``."""
        return await self.admission.box(limits, wait_s, gone)

    def capacity(self) -> Capacity:
        # A spare on its way that an open claimed is that open's box: admitted already.
        return self.admission.capacity(len(self.spares), self.refilling - self._claimed())

    def _claimed(self) -> int:
        return sum(not claim.done() for claim in self.claims)

    def spare_coming(self) -> bool:
        """Whether a spare on its way is not promised to an open yet."""
        return self.refilling > self._claimed()

    async def next_spare(self) -> Spare | None:
        """The next spare on its way, for an open that found none ready (``None``: it failed
        to start). The zygote makes boxes one at a time, so a box of the open's own would be
        made after it anyway: a kernel's first opens come while its first spares start."""
        claim: asyncio.Future[Spare | None] = self.loop.create_future()
        self.claims.append(claim)
        return await claim

    def _promise(self, spare: Spare | None) -> bool:
        """Give ``spare`` to the first open still waiting for one (``next_spare``)."""
        while self.claims:
            claim = self.claims.popleft()
            if not claim.done():  # else the open gave up (its task was cancelled)
                claim.set_result(spare)
                return True
        return False

    def take_spare(self) -> Spare | None:
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
            if self.admission.waiters:  # room goes to who waits for it first
                return
            box = self.pool.take(self.caps.defaults())
            if box is None:
                return
            self.refilling += 1
            self._in_background(self._make_spare(box))

    async def _make_spare(self, box: Box) -> None:
        try:
            proc = await self.spawn(box, True)
        except Exception as exc:  # whatever it was, the box is ended and its number returns
            log.warning("a spare session process could not start: %s", exc)
            self.end_box(box, None)
            self._promise(None)  # its open makes a box of its own
            return
        finally:
            self.refilling -= 1
        if self.closing:
            proc.close(self.loop)
            self.end_box(box, proc)
            self._promise(None)
        elif not self._promise((box, proc)):
            self.spares.append((box, proc))

    def end_box(self, box: Box, proc: SessionProcess | None) -> None:
        box.env = {}  # the next tenant's processes start without this one's proxy

        async def reset_then_give_back() -> None:
            try:
                clean = await self.reset(box, proc, remove=True)
            except Exception:  # e.g. out of fds for pidfds: not reused, never lost unsaid
                log.exception("box %d (uid %d) could not be reset", box.number, box.uid)
                clean = False
            self._give_back(box, clean)
            if not clean:
                self._retry(box, QUARANTINE_RETRY_S)

        self._in_background(reset_then_give_back())

    def _give_back(self, box: Box, clean: bool) -> None:
        """A box's number and budgets back to the pool: to who waits for them first, else to
        a spare."""
        self.pool.give_back(box, clean=clean)
        self.admission.wake()
        if not self.closing:
            self.refill()

    def _retire_spare(self) -> None:
        """End a spare process: a request waits for the room its box holds."""
        if self.spares:
            box, proc = self.spares.pop()
            proc.close(self.loop)
            self.end_box(box, proc)

    def _retry(self, box: Box, after_s: float) -> None:
        """Reset a quarantined box again after ``after_s`` (doubling, up to ten minutes): what
        kept it (a process stuck in the kernel; with ``uids``, a file of its uid in a
        neighbour's directory it could not empty) may be gone by then; until then its number
        stays out of use."""

        async def again() -> None:
            clean = await self.reset(box, None, remove=True)
            self._give_back(box, clean)
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
        while self._promise(None):
            pass
        while self.spares:
            box, proc = self.spares.pop()
            proc.close(self.loop)
            self.end_box(box, proc)
