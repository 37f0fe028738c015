"""``SessionProcess``: one forked session process as the supervisor sees it.

Its control socket carries frames (``wire.session_frames``): the cell out, then the cell's
``display`` and host ``call`` frames, answered as they come, and its ``cell_done``. Its
stdout/stderr are pipes read into head+tail capped buffers as they fill, so output is captured
at the file-descriptor level and a flood is noticed while the cell runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import weakref
from collections.abc import Callable
from typing import Any

from ..boxes.box_protocol import Exited
from ..wire.framing import encode, read_frame
from ..wire.protocol import FileRequest
from ..wire.session_frames import (
    Ack,
    CallAnswer,
    CallFrame,
    CellDone,
    FileDone,
    MalformedFrame,
    from_session,
)
from .output import CappedBuffer, drain_into
from .streaming import CellEvents, Emit

log = logging.getLogger("farm.kernel")

DEFAULT_OUTPUT_BYTES = 1024 * 1024
FLOOD_FACTOR = 8


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
        self.exit: Exited | None = None
        self.broken: str | None = None  # a malformed frame it sent (user code can write one)
        self.waker: Callable[[], None] | None = None  # the running cell's watch (cell_watch)
        self.exited: asyncio.Event = _Ended(self)  # it pokes the running cell's watch
        self.events: CellEvents | None = None
        self.calls = 0  # host calls of this process so far (their ids)
        self.allowed: frozenset[str] = frozenset()  # the callbacks the running cell may call
        self.waiting: int | None = None  # the call that awaits the host's answer
        self.closed = False
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    def renew(self, pid: int) -> None:
        """The session goes on in ``pid`` (a rollback's): not ended, with a fresh ``exited``."""
        self.pid, self.exit, self.broken = pid, None, None
        self.exited = _Ended(self)

    def wake(self) -> None:
        if self.waker is not None:
            self.waker()

    async def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.reader, self.writer = await asyncio.open_unix_connection(sock=self.ctl)
        for fd in self.fds:
            os.set_blocking(fd, False)
            loop.add_reader(fd, self.drain, fd)

    def drain(self, fd: int) -> None:
        """Move what the pipe holds into the buffer (called when readable, and at cell end)."""
        if self.closed:
            return
        buf = self.fds[fd]
        if not drain_into(fd, buf):
            asyncio.get_running_loop().remove_reader(fd)
        if self.events is not None:
            self.events.output(buf)
        if buf.total > self.flood_limit:
            self.flood.set()
            self.wake()

    def start_cell(self, cap: int, emit: Emit | None, calls: list[str] | None = None) -> None:
        for buf in self.fds.values():
            buf.reset(cap)
        self.flood_limit = cap * FLOOD_FACTOR
        self.flood.clear()
        self.events = CellEvents(emit, self.out, self.err) if emit is not None else None
        self.allowed = frozenset(calls or ())

    async def cell_reply(self) -> CellDone | None:
        """Read the session's frames until its ``cell_done``. A ``display`` on the way goes
        out as an event (dropped when nobody asked for events) and is answered, which lets the
        session go on; a host ``call`` goes out as an event, answered once the host replied."""
        while True:
            try:
                frame = from_session(await read_frame(self.reader))
            except MalformedFrame as exc:
                self.broken = str(exc)  # the manager replaces this process, saying why
                raise
            if frame is None or frame["type"] == "cell_done":
                return frame
            if frame["type"] == "call":
                self._forward_call(frame)
            elif frame["type"] == "display":
                for fd in self.fds:  # the session waits: the pipes hold exactly what came first
                    self.drain(fd)
                if self.events is not None:
                    self.events.display(frame.get("value"))
                ack: Ack = {"type": "ack"}
                self.writer.write(encode(ack))
            else:
                log.warning("session pid %d sent an unknown frame %r", self.pid, frame["type"])

    async def exchange(self, frame: FileRequest, timeout_s: float) -> FileDone | None:
        """Send a ``file`` request between cells (the host's frame as ``requests.file`` let it
        through) and read its one reply frame, the ``file_done`` (typed, not checked: the
        manager reads its fields with ``get``)."""
        self.writer.write(encode(frame))
        await self.writer.drain()
        reply = from_session(await asyncio.wait_for(read_frame(self.reader), timeout_s))
        if reply is not None and reply["type"] != "file_done":
            raise MalformedFrame(f"a {reply['type']!r} frame where a 'file_done' was due")
        return reply

    def _forward_call(self, frame: CallFrame) -> None:
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
            interrupt: CallAnswer = {"type": "answer", "ok": False, "interrupt": True}
            self.writer.write(encode(interrupt))

    def _answer(self, ok: bool, *, value: Any = None, error: tuple[str, str] = ("", "")) -> None:
        body: CallAnswer = {"type": "answer", "ok": ok}
        if ok:
            body["value"] = value
        else:
            body["error"] = {"ename": error[0], "evalue": error[1]}
        self.writer.write(encode(body))

    def signal(self, sig: int, *, group: bool) -> None:
        """Signal the process (``group``: its whole process group first); the supervisor may
        (CAP_KILL, or the same uid), and its pid is not reused before it is reaped."""
        if self.exit is not None:
            return  # reaped: the pid may be another process's by now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.pid, sig)
            os.kill(self.pid, sig)

    def describe_exit(self) -> str:
        if self.exit is None:
            return "the session process stopped answering"
        if "signal" in self.exit:
            return f"the session process was killed by {signal.Signals(self.exit['signal']).name}"
        return f"the session process exited with code {self.exit.get('code')}"

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Let go of the process's pipes and socket, once (killing it is the box's reset): a
        second close must not close fd numbers the loop may have given to someone else."""
        if self.closed:
            return
        self.closed = True
        for fd in self.fds:
            loop.remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        self.writer.close()


class _Ended(asyncio.Event):
    """``SessionProcess.exited``: setting it also pokes the running cell's watch. It holds its
    process weakly: a cycle would keep every ended process, its captured output with it, until
    the collector's rare full pass (hundreds of them in a busy kernel)."""

    def __init__(self, proc: SessionProcess) -> None:
        super().__init__()
        self.proc = weakref.ref(proc)

    def set(self) -> None:
        super().set()
        proc = self.proc()
        if proc is not None:
            proc.wake()
