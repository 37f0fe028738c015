"""The supervisor's side of sessions: spawn, execute with deadlines and caps, replace, close.

Invariants:
- a call must carry the session's current epoch; an old epoch gets ``state_lost`` and runs
  nothing, because silently running in a fresh namespace would corrupt an evaluation;
- a timeout interrupts first (state kept); only code that ignores the interrupt for
  ``grace_s`` is killed with its whole process group, and then the session gets a fresh
  process with ``epoch + 1`` and the result says ``state_lost``;
- a session process that dies (``os._exit``, segfault, OOM kill) is replaced the same way and
  the death is reported, never hidden;
- captured output is bounded per stream, and a flood past ``flood_factor`` times the cap
  interrupts the cell with kind ``output_limit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from typing import Any

from . import KIND_OOM, KIND_OUTPUT_LIMIT, KIND_TIMEOUT, NOT_RUN
from .cell import Cell
from .framing import FrameError, encode, read_frame
from .output import CappedBuffer
from .streaming import CellEvents, Emit

log = logging.getLogger("farm.kernel")

DEFAULT_OUTPUT_BYTES = 1024 * 1024
FLOOD_FACTOR = 8
SPAWN_TIMEOUT_S = 10.0
_OOM_EVENT_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


class RequestError(Exception):
    """A request the kernel refuses; ``code`` travels in the error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def oom_kills() -> int | None:
    """The cgroup's OOM-kill counter, to tell a memory kill from any other SIGKILL."""
    for path in _OOM_EVENT_FILES:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


class SessionProcess:
    """One forked session process and its capture pipes, as the supervisor sees it."""

    def __init__(self, pid: int, ctl: socket.socket, out_fd: int, err_fd: int) -> None:
        self.pid = pid
        self.ctl = ctl
        self.fds = {fd: CappedBuffer(DEFAULT_OUTPUT_BYTES) for fd in (out_fd, err_fd)}
        self.out = self.fds[out_fd]
        self.err = self.fds[err_fd]
        self.flood_limit = DEFAULT_OUTPUT_BYTES * FLOOD_FACTOR
        self.flood = asyncio.Event()
        self.exit: dict[str, Any] | None = None
        self.exited = asyncio.Event()
        self.events: CellEvents | None = None
        self.calls = 0  # host calls of this process so far (their ids)
        self.allowed: frozenset[str] = frozenset()  # the callbacks the running cell may call
        self.waiting: int | None = None  # the call that awaits the host's answer
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    async def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.reader, self.writer = await asyncio.open_unix_connection(sock=self.ctl)
        for fd in self.fds:
            os.set_blocking(fd, False)
            loop.add_reader(fd, self.drain, fd)

    def drain(self, fd: int) -> None:
        """Move what the pipe holds into the buffer (called when readable, and at cell end)."""
        buf = self.fds[fd]
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                asyncio.get_running_loop().remove_reader(fd)
                break
            buf.write(data)
        if self.events is not None:
            self.events.output(buf)
        if buf.total > self.flood_limit:
            self.flood.set()

    def start_cell(self, cap: int, emit: Emit | None, calls: list[str] | None = None) -> None:
        for buf in self.fds.values():
            buf.reset(cap)
        self.flood_limit = cap * FLOOD_FACTOR
        self.flood.clear()
        self.events = CellEvents(emit, self.out, self.err) if emit is not None else None
        self.allowed = frozenset(calls or ())

    async def cell_reply(self) -> dict[str, Any] | None:
        """Read the session's frames until its ``cell_done``. A ``display`` on the way goes
        out as an event (dropped when nobody asked for events) and is answered, which lets the
        session go on: a request from sandboxed code that needs a real answer (a host
        callback) would be one more frame type here, answered once the host replied."""
        while True:
            frame = await read_frame(self.reader)
            if frame is None or frame["type"] == "cell_done":
                return frame
            if frame["type"] == "call":
                self._forward_call(frame)
            elif frame["type"] == "display":
                for fd in self.fds:  # the session waits: the pipes hold exactly what came first
                    self.drain(fd)
                if self.events is not None:
                    self.events.display(frame.get("value"))
                self.writer.write(encode({"type": "ack"}))
            else:
                log.warning("session pid %d sent an unknown frame %r", self.pid, frame["type"])

    def _forward_call(self, frame: dict[str, Any]) -> None:
        """A host callback from the cell (``farm.kernel.calls``): out as an event, then wait."""
        for fd in self.fds:  # what the cell printed before the call comes first
            self.drain(fd)
        self.calls += 1
        if self.events is None:
            self._answer(False, error=("CallbackError", "no host listens for callbacks here"))
            return
        if frame.get("name") not in self.allowed:
            why = f"no callback named {frame.get('name')!r} is registered for this session"
            self._answer(False, error=("CallbackError", why))
            return
        self.waiting = self.calls
        self.events.flush()
        self.events.emit(
            {
                "type": "call",
                "id": self.calls,
                "name": str(frame.get("name")),
                "args": frame.get("args", []),
                "kwargs": frame.get("kwargs", {}),
                "batch": bool(frame.get("batch")),
            }
        )

    def answer(self, frame: dict[str, Any]) -> None:
        """The host's answer to the waiting call; a late one (its call is over) is dropped."""
        if self.waiting is None or frame.get("id") != self.waiting:
            return
        self.waiting = None
        error = frame.get("error") or {}
        why = (str(error.get("ename", "Error")), str(error.get("evalue", "")))
        self._answer(bool(frame.get("ok")), value=frame.get("value"), error=why)

    def abandon_call(self) -> None:
        """The cell must stop: answer its waiting call with an interrupt (raised there)."""
        if self.waiting is not None:
            self.waiting = None
            self.writer.write(encode({"type": "answer", "ok": False, "interrupt": True}))

    def _answer(self, ok: bool, *, value: Any = None, error: tuple[str, str] = ("", "")) -> None:
        body: dict[str, Any] = {"type": "answer", "ok": ok}
        if ok:
            body["value"] = value
        else:
            body["error"] = {"ename": error[0], "evalue": error[1]}
        self.writer.write(encode(body))

    def signal(self, sig: int, *, group: bool) -> None:
        try:
            if group:
                os.killpg(self.pid, sig)
            os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def describe_exit(self) -> str:
        if self.exit is None:
            return "the session process stopped answering"
        if "signal" in self.exit:
            return f"the session process was killed by {signal.Signals(self.exit['signal']).name}"
        return f"the session process exited with code {self.exit.get('code')}"

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        self.signal(signal.SIGKILL, group=True)
        for fd in self.fds:
            loop.remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        self.writer.close()


class Session:
    def __init__(self, session_id: str, proc: SessionProcess, tools: bool) -> None:
        self.id = session_id
        self.tools = tools
        self.epoch = 1
        self.proc = proc
        self.lock = asyncio.Lock()
        self.last_used = time.monotonic()


class SessionManager:
    """Owns the zygote connection and every session of this kernel."""

    def __init__(
        self,
        zygote: socket.socket,
        *,
        grace_s: float,
        max_sessions: int,
        workspace: str | None = None,
        tool_limit: int = 3000,
    ) -> None:
        self.workspace = workspace
        self.tool_limit = tool_limit
        self.zygote = zygote
        self.grace_s = grace_s
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self.by_pid: dict[int, SessionProcess] = {}
        self.pending: list[asyncio.Future[tuple[int, list[int]]]] = []
        self.loop = asyncio.get_running_loop()
        zygote.setblocking(False)
        self.loop.add_reader(zygote, self._on_zygote)
        self.zygote_alive = True
        # Set when the zygote dies: its sessions died with it (PDEATHSIG) and no new one can
        # start, so the kernel stops and its sandbox is replaced (``serve_forever``).
        self.zygote_lost = asyncio.Event()
        self.oom_baseline = oom_kills()

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
                return
            message = json.loads(data)
            if message["op"] == "spawned":
                self.pending.pop(0).set_result((message["pid"], fds))
            elif message["op"] == "exited":
                proc = self.by_pid.pop(message["pid"], None)
                if proc is not None:
                    proc.exit = message
                    proc.exited.set()

    async def _spawn(self, tools: bool = True) -> SessionProcess:
        if not self.zygote_alive:
            raise RequestError("unavailable", "the kernel cannot start sessions (zygote gone)")
        future: asyncio.Future[tuple[int, list[int]]] = self.loop.create_future()
        self.pending.append(future)
        config = {"tools": tools, "workspace": self.workspace, "tool_limit": self.tool_limit}
        self.zygote.send(json.dumps({"op": "spawn", "session": config}).encode())
        pid, fds = await asyncio.wait_for(future, SPAWN_TIMEOUT_S)
        proc = SessionProcess(pid, socket.socket(fileno=fds[0]), fds[1], fds[2])
        self.by_pid[pid] = proc
        await proc.attach(self.loop)
        return proc

    async def open(self, tools: bool = True) -> dict[str, Any]:
        if len(self.sessions) >= self.max_sessions:
            raise RequestError(
                "too_many_sessions", f"this kernel holds {self.max_sessions} sessions"
            )
        session = Session(uuid.uuid4().hex, await self._spawn(tools), tools)
        self.sessions[session.id] = session
        log.info("session %s opened (pid %d)", session.id, session.proc.pid)
        return {"type": "session_opened", "session_id": session.id, "epoch": session.epoch}

    def answer(self, frame: dict[str, Any]) -> None:
        """The host answered a host call of a running cell (``answer`` frames)."""
        session = self.sessions.get(str(frame.get("session_id")))
        if session is not None:
            session.proc.answer(frame)

    def close(self, session_id: str) -> dict[str, Any]:
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise RequestError("no_such_session", f"no session {session_id!r} in this kernel")
        session.proc.close(self.loop)
        log.info("session %s closed", session_id)
        return {"type": "session_closed", "session_id": session_id}

    def close_all(self) -> None:
        for session_id in list(self.sessions):
            self.close(session_id)

    def _oom_since(self) -> bool:
        """Did the cgroup OOM-kill anything since the last death we looked at?

        Read only after a death (it costs a file read), against the baseline of the previous
        one, so the hot path never touches cgroup files.
        """
        now = oom_kills()
        before, self.oom_baseline = self.oom_baseline, now
        return before is not None and now is not None and now > before

    async def _replace(self, session: Session) -> None:
        session.proc.close(self.loop)
        session.epoch += 1
        session.proc = await self._spawn(session.tools)
        log.warning("session %s replaced, now at epoch %d", session.id, session.epoch)

    async def execute(self, request: dict[str, Any], emit: Emit | None = None) -> dict[str, Any]:
        session = self.sessions.get(request["session_id"])
        if session is None:
            raise RequestError("no_such_session", f"no session {request['session_id']!r} here")
        async with session.lock:
            session.last_used = time.monotonic()
            result = await self._execute_locked(session, request, emit)
            session.last_used = time.monotonic()
            return result

    async def _execute_locked(
        self, session: Session, request: dict[str, Any], emit: Emit | None
    ) -> dict[str, Any]:
        cell = Cell(session, request)
        if request["epoch"] != session.epoch:
            return cell.lost(
                f"epoch {request['epoch']} of this session is gone (current epoch "
                f"{session.epoch}): its variables were lost; {NOT_RUN}"
            )
        proc = session.proc
        if proc.exit is None:
            proc.start_cell(request["max_output_bytes"], emit, request.get("calls"))
            try:
                proc.writer.write(
                    encode(
                        {"type": "cell", "code": request["code"], "calls": request.get("calls", [])}
                    )
                )
                await proc.writer.drain()
            except (ConnectionError, OSError):  # it died before its exit was reported
                await asyncio.wait({asyncio.ensure_future(proc.exited.wait())}, timeout=2.0)
                proc.exit = proc.exit or {"code": None}
                proc.events = None
        if proc.exit is not None:
            death = proc.describe_exit()
            await self._replace(session)
            return cell.lost(f"{death} between calls; its variables are gone; {NOT_RUN}")
        if proc.events is not None:
            proc.events.started()
        reply, reason, killed = await self._run(proc, request)
        cell.finish(proc)
        if proc.events is not None:
            proc.events.finish()
            proc.events = None
        if reply is not None:
            return cell.done(reply, reason)
        await asyncio.wait({asyncio.ensure_future(proc.exited.wait())}, timeout=2.0)
        what = proc.describe_exit()
        await self._replace(session)
        if killed and reason is not None:
            return cell.killed(reason, self.grace_s)
        sigkill = proc.exit is not None and proc.exit.get("signal") == signal.SIGKILL
        if sigkill and self._oom_since():
            return cell.lost(f"{what}: out of memory; its variables are gone", kind=KIND_OOM)
        return cell.lost(f"{what} during this call; its variables are gone")

    async def _run(
        self, proc: SessionProcess, request: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, str | None, bool]:
        """Wait for the cell's reply (it was sent), interrupting and killing as the rules say."""
        reply_task = asyncio.ensure_future(proc.cell_reply())
        flood_task = asyncio.ensure_future(proc.flood.wait())
        reason: str | None = None
        killed = False
        try:
            done, _ = await asyncio.wait(
                {reply_task, flood_task},
                timeout=request["timeout_s"],
                return_when=asyncio.FIRST_COMPLETED,
            )
            if reply_task not in done:
                reason = KIND_OUTPUT_LIMIT if flood_task in done else KIND_TIMEOUT
                proc.abandon_call()
                proc.signal(signal.SIGINT, group=False)
                done, _ = await asyncio.wait({reply_task}, timeout=self.grace_s)
                if reply_task not in done:
                    killed = True
                    proc.signal(signal.SIGKILL, group=True)
                    await asyncio.wait({reply_task}, timeout=5.0)
        finally:
            flood_task.cancel()
        if not reply_task.done():
            reply_task.cancel()
            return None, reason, killed
        try:
            return reply_task.result(), reason, killed
        except (FrameError, ConnectionError, OSError):
            return None, reason, killed
