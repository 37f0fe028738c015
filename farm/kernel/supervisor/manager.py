"""The supervisor's sessions: open, execute with deadlines and caps, replace, close.

Invariants: a call with an old epoch gets ``state_lost`` and runs nothing; a timeout interrupts
first and kills only after ``grace_s`` (then ``epoch + 1``, ``state_lost``); a dead session
process is replaced and its death reported, never hidden; a closed session's box is reset
before its number is used again; output is bounded per stream (a flood is ``output_limit``).
Details: docs/design/kernel.md.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from .. import KIND_OOM, NOT_RUN
from ..boxes import egress
from ..boxes.pool import Box, BoxPool, Caps, LimitsError
from ..boxes.trees import kill_tree
from ..wire.framing import FrameError, encode
from ..wire.protocol import (
    DEFAULT_WAIT_S,
    BoxLimits,
    CellResult,
    CommandOutcome,
    CommandReply,
    Execute,
    FileReply,
    FileRequest,
    SessionClosed,
    SessionOpened,
)
from ..wire.session_frames import CellFrame
from .admission import host_left
from .cell import Cell, kill_notes, over_budget
from .cell_watch import read_reply
from .checkpoints import Checkpoints
from .judges import Judges
from .links import RequestError
from .memwatch import MemoryWatch, Watched
from .requests import CommandCall
from .session_state import OomCounter, Session, revoke
from .spawner import Spawner
from .streaming import Emit

log = logging.getLogger("farm.kernel")
FILE_TIMEOUT_S = 120.0  # one chunk of a file operation (a listing of a big tree may be slow)
CLOSED_EARLY_KEPT = 4096  # ids of boxes closed before they opened, remembered


class SessionManager:
    """Owns the zygote connection, the box pool and every session of this kernel."""

    def __init__(
        self,
        zygote: socket.socket,
        pool: BoxPool,
        *,
        grace_s: float,
        max_sessions: int,
        tool_limit: int = 3000,
        caps: Caps | None = None,
        egress_ca: str | None = None,
    ) -> None:
        self.caps = caps or Caps.of_this_sandbox()
        self.spawner = Spawner(zygote, pool, self.caps, tool_limit, max_sessions)
        self.judges = Judges(self.spawner)
        self.grace_s = grace_s
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self.closed_early: dict[str, None] = {}  # ids closed before they opened, oldest first
        self.watch = MemoryWatch(self._watched) if pool.per_uid else None
        self.egress_ca = egress_ca  # the CA bundle boxes with egress are told to trust
        # Hands a box's proxy endpoint to the host's proxy (``KernelServer``): session id, port,
        # socket; raises ``RequestError`` when no proxy is attached.
        self.hand_over: Callable[[str, int, socket.socket], None] | None = None
        self.opens = 0
        self.spare_opens = 0  # opens that took a ready process (no fork while the host waits)
        self.loop = asyncio.get_running_loop()
        self.checkpoints = Checkpoints(self)
        self.ooms = OomCounter()

    async def open(
        self,
        tools: bool = True,
        limits: dict[str, Any] | None = None,
        session_id: str | None = None,
        egress: bool = False,
        wait_s: float = DEFAULT_WAIT_S,
        gone: asyncio.Future[Any] | None = None,
    ) -> SessionOpened:
        """Open a session: a spare process when it fits (the usual case: default limits and
        tools), else a process spawned for it; either way a box of its own, which waits up to
        ``wait_s`` for room (``admission``; ``gone``: the host's connection, whose end stops the
        wait). ``session_id`` is the host's choice (a one-shot
        ``item``), else a new one. With ``egress`` the box gets a proxy endpoint, handed to the
        host's proxy under the session's id, and its processes the variables that name it."""
        if session_id is not None and session_id in self.sessions:
            raise RequestError("bad_request", f"session {session_id!r} exists already")
        checked = self.check_open(session_id, limits)
        if egress and self.hand_over is None:
            raise RequestError("unavailable", "no egress proxy is attached to this kernel")
        fits = tools and not egress and checked == self.caps.defaults()
        admission = self.spawner.admission
        spare = admission.spare(self.spawner.take_spare) if fits else None
        if spare is None and fits and self.spawner.spare_coming():
            spare = await admission.spare_later(self.spawner.next_spare)
        self.opens += 1
        session_id = session_id or uuid.uuid4().hex
        queue_s = 0.0  # how long its box waited for room
        if spare is not None:
            session = Session(session_id, spare[0], tools)
            session.proc = spare[1]
            self.spare_opens += 1
        else:
            asked = self.loop.time()
            box = await self.admit(session_id, checked, wait_s, gone)
            session = Session(session_id, box, tools)
            queue_s = self.loop.time() - asked
            try:
                if egress:
                    await self._endpoint(session)
                session.proc = await self.spawner.spawn(session.box, tools)
            except BaseException:
                revoke(session)
                self.spawner.end_box(session.box, None)
                admission.release()
                raise
        box, proc = session.box, session.proc
        self.sessions[session.id] = session
        self.spawner.refill()
        if host_left(gone):  # no one will hear of it: it would hold its box for ever
            self.close(session.id)
            raise RequestError("unavailable", "the host's connection ended while it opened")
        if session.id in self.closed_early:  # closed while its process started: nothing ran
            self.close(session.id)
            self.refuse_closed(session.id)
        log.debug(  # debug: at a batch's rate (hundreds a second) a line each costs dockerd
            "session %s opened (pid %d, box %d, uid %d)", session.id, proc.pid, box.number, box.uid
        )
        return {
            "type": "session_opened",
            "session_id": session.id,
            "epoch": session.epoch,
            "queue_s": queue_s,
        }

    async def admit(
        self,
        session_id: str,
        limits: BoxLimits,
        wait_s: float,
        gone: asyncio.Future[Any] | None = None,
    ) -> Box:
        """A box for ``session_id``, once there is room (``admission``); refused if the host
        closed the id while it waited (a cancelled map), with nothing run."""
        box = await self.spawner.take_box(limits, wait_s, gone)
        if session_id in self.closed_early:
            self.spawner.admission.release(box, returned=True)
            self.refuse_closed(session_id)
        return box

    def refuse_closed(self, session_id: str | None) -> None:
        """Refuse (once) an id the host closed before it opened: nothing runs for it."""
        if session_id is not None and session_id in self.closed_early:
            del self.closed_early[session_id]
            raise RequestError("no_such_session", f"session {session_id!r} was closed already")

    def check_open(self, session_id: str | None, limits: dict[str, Any] | None) -> BoxLimits:
        """The limits of a box about to open as ``session_id``, checked against the caps; an
        id the host closed before it opened is refused (once), and nothing runs for it."""
        self.refuse_closed(session_id)
        try:
            return self.caps.check(limits)
        except LimitsError as exc:
            raise RequestError("bad_limits", str(exc)) from None

    async def _endpoint(self, session: Session) -> None:
        """Make the box's proxy endpoint and hand it to the host's proxy; the session keeps
        its own copy, to revoke it when the session ends (``sessions.revoke``)."""
        port, session.endpoint = await self.spawner.inits.endpoint(session.box)
        session.box.env = egress.proxy_env(port, self.egress_ca)
        assert self.hand_over is not None
        self.hand_over(session.id, port, session.endpoint)

    def _watched(self) -> list[Watched]:
        return [w for session in self.sessions.values() if (w := session.watched()) is not None]

    def answer(self, frame: dict[str, Any]) -> None:
        """The host answered a host call of a running cell (``answer`` frames)."""
        session = self.sessions.get(str(frame.get("session_id")))
        if session is not None:
            session.proc.answer(frame)

    def close(self, session_id: str) -> SessionClosed:
        """End the session now; its box is reset (every process and file of its uid goes) in
        the background and only then given back to the pool."""
        session = self.sessions.pop(session_id, None)
        if session is None and self.judges.stop(session_id):  # a judge item without a process
            return {"type": "session_closed", "session_id": session_id}
        if session is None:
            # The host may close an item's box before it opened (a map cancelled at once): the
            # id is remembered so that the open, when it comes, is refused and runs nothing.
            self.closed_early[session_id] = None
            while len(self.closed_early) > CLOSED_EARLY_KEPT:
                del self.closed_early[next(iter(self.closed_early))]
            raise RequestError("no_such_session", f"no session {session_id!r} in this kernel")
        session.closed = True
        revoke(session)
        self.checkpoints.forget(session_id)
        # Killed before its socket is closed: closing first would wake it to read the end of
        # its input and exit by itself, which costs more than the kill its box gets anyway.
        session.proc.signal(signal.SIGKILL, group=True)
        session.proc.close(self.loop)
        self.spawner.end_box(session.box, session.proc)
        self.spawner.admission.release()
        log.debug("session %s closed", session_id)
        return {"type": "session_closed", "session_id": session_id}

    def close_all(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.spawner.close()
        for session_id in list(self.sessions):
            self.close(session_id)
        self.ooms.close()

    def _oom_since(self, before: int | None) -> bool:
        """Did the sandbox's cgroup OOM-kill anything since ``before`` (read as the cell was
        sent)? Counted per cell, so an OOM kill in another box earlier (a neighbour's fork bomb
        children) is never blamed on a cell that killed itself; one file read per cell."""
        now = self.ooms.read()
        return before is not None and now is not None and now > before

    async def _replace(self, session: Session) -> None:
        """A fresh process in the same box (files kept), once every process of the old one is
        gone: nothing the lost namespace started survives into the new epoch. None for a
        session closed meanwhile (its end resets the box; a process started now could outlive
        it) or a one-shot item's (closed next)."""
        self.checkpoints.retire(session)  # its socket stays while a checkpoint shares it
        session.epoch += 1
        if session.closed or session.one_shot:
            return
        if self.checkpoints.count(session.id):  # they are spared: a rollback may follow
            await self.checkpoints.empty_box(session, session.proc)
        else:
            await self.spawner.reset(session.box, session.proc, remove=False)
        if session.closed:
            return
        proc = await self.spawner.spawn(session.box, session.tools)
        if session.closed:  # closed while it started: it goes with the box
            proc.signal(signal.SIGKILL, group=True)
            proc.close(self.loop)
            return
        session.proc = proc
        log.warning("session %s replaced, now at epoch %d", session.id, session.epoch)

    async def file(self, request: FileRequest) -> FileReply:
        """A file operation (``fileops``), done by the session process between its cells; a
        process found dead is replaced first (its next cell then reports the loss)."""
        session = self.session(request["session_id"])
        async with session.lock:
            if session.proc.exit is not None:
                await self._replace(session)
            if session.closed:
                raise RequestError("no_such_session", f"session {session.id!r} was closed")
            try:
                reply = await session.proc.exchange(request, FILE_TIMEOUT_S)
            except FrameError as exc:  # its stream cannot be trusted any more: replaced
                proc = session.proc
                proc.signal(signal.SIGKILL, group=True)
                await asyncio.wait({asyncio.ensure_future(proc.exited.wait())}, timeout=2.0)
                await self._replace(session)
                raise RequestError(
                    "unavailable",
                    f"the session process answered a file request with {exc}, so it was "
                    "replaced; its variables are gone",
                ) from None
            except (asyncio.TimeoutError, ConnectionError, OSError):
                reply = None
            if reply is None:
                raise RequestError(
                    "unavailable", "the session process did not answer a file request"
                )
        done: FileReply = {
            "type": "file_result",
            "result": reply.get("result"),
            "error": reply.get("error"),
        }
        if isinstance(reply.get("blob"), bytes):
            done["blob"] = reply["blob"]
        return done

    async def command(self, request: CommandCall) -> CommandReply:
        """Run a command in the session's box (``commands``): no lock, so commands of one
        session run at once, beside its cells."""
        session = self.session(request["session_id"])
        run = await self.spawner.command(
            session.box,
            request["argv"],
            request["max_output_bytes"],
            cwd=request["cwd"],
            env=request["env"],
            stdin_path=request["stdin_path"],
        )
        if session.closed:  # closed while it started: it goes with the box, unrun
            kill_tree(run.pid)
            run.close()
            raise RequestError("no_such_session", f"session {session.id!r} was closed")
        session.last_used = time.monotonic()
        kills = len(session.memory_kills)
        done = await run.run(request["stdin"], request["timeout_s"])
        session.last_used = time.monotonic()
        result: CommandOutcome = {
            "exec_id": request["exec_id"],
            "session_id": session.id,
            "returncode": done["returncode"],
            "signal": done["signal"],
            "timed_out": done["timed_out"],
            "stdout": done["stdout"],
            "stderr": done["stderr"] + kill_notes(session.memory_kills[kills:]),
            "stdout_truncated": done["stdout_truncated"],
            "stderr_truncated": done["stderr_truncated"],
            "duration_s": done["duration_s"],
        }
        return {"type": "command_result", "result": result}

    def session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError("no_such_session", f"no session {session_id!r} here")
        return session

    async def execute(self, request: Execute, emit: Emit | None = None) -> CellResult:
        session = self.session(request["session_id"])
        async with session.lock:
            session.last_used = time.monotonic()
            kills = len(session.memory_kills)
            result = await self._execute_locked(session, request, emit)
            session.last_used = time.monotonic()
            return over_budget(result, session.memory_kills[kills:])

    async def _execute_locked(
        self, session: Session, request: Execute, emit: Emit | None
    ) -> CellResult:
        cell = Cell(session, request)
        if request["epoch"] != session.epoch:
            return cell.lost(
                f"epoch {request['epoch']} of this session is gone (current epoch "
                f"{session.epoch}): its variables were lost; {NOT_RUN}"
            )
        proc = session.proc
        ooms_before = self.ooms.read()
        if proc.exit is None:
            proc.start_cell(request["max_output_bytes"], emit, request.get("calls"))
            frame: CellFrame = {
                "type": "cell",
                "code": request["code"],
                "calls": request.get("calls", []),
            }
            try:
                proc.writer.write(encode(frame))
                await proc.writer.drain()
            except (ConnectionError, OSError):  # it died before its exit was reported
                await asyncio.wait({asyncio.ensure_future(proc.exited.wait())}, timeout=2.0)
                proc.exit = proc.exit or {"op": "exited", "pid": proc.pid, "code": None}
                proc.events = None
        if proc.exit is not None:
            death = proc.describe_exit()
            await self._replace(session)
            return cell.lost(f"{death} between calls; its variables are gone; {NOT_RUN}")
        if proc.events is not None:
            proc.events.started()
        reply, reason, killed = await read_reply(proc, request["timeout_s"], self.grace_s)
        cell.finish(proc)
        if proc.events is not None:
            proc.events.finish()
            proc.events = None
        if reply is not None:
            return cell.done(reply, reason)
        if self.sessions.get(session.id) is not session:  # closed while the cell ran
            return cell.lost("the session was closed while this call ran")
        if proc.broken is not None:  # its code wrote to the control socket: it cannot be trusted
            proc.signal(signal.SIGKILL, group=True)
            await asyncio.wait({asyncio.ensure_future(proc.exited.wait())}, timeout=2.0)
            await self._replace(session)
            return cell.lost(
                f"the session process sent {proc.broken} on its control socket, so it was "
                "replaced; its variables are gone"
            )
        await asyncio.wait({asyncio.ensure_future(proc.exited.wait())}, timeout=2.0)
        what = proc.describe_exit()
        await self._replace(session)
        if killed and reason is not None:
            return cell.killed(reason, self.grace_s)
        sigkill = proc.exit is not None and proc.exit.get("signal") == signal.SIGKILL
        if sigkill and self._oom_since(ooms_before):
            return cell.lost(f"{what}: out of memory; its variables are gone", kind=KIND_OOM)
        return cell.lost(f"{what} during this call; its variables are gone")
