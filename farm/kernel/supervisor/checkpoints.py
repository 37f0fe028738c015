"""Checkpoints of sessions as the supervisor holds them: take one, roll back to one, drop one.

A checkpoint is a held copy of the session process (``repl.held_copies``), known here by its
pid in the sandbox and a pidfd. Invariants: at most ``MAX_CHECKPOINTS`` per session; a rollback
kills every process of the box but its checkpoints before it wakes one, so nothing of the line
it leaves survives into the new epoch (``epoch + 1``); both ends of the control socket are
drained, and the session's pid and exit are the new process's before any call goes on; a
session closed or replaced keeps no checkpoint the box no longer holds. Design:
docs/design/fork.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import socket
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..boxes import procs
from ..repl.held_copies import GO, KEEP, REFILL, TAKE
from ..wire.branch_frames import Branched, BranchOp
from .held_answers import all_ended, ask, wake
from .links import RequestError

if TYPE_CHECKING:
    from .session_process import SessionProcess
    from .session_state import Session
    from .spawner import Spawner

log = logging.getLogger("farm.kernel")

MAX_CHECKPOINTS = 8  # per session: each holds a copy of the box's files and a process
KILL_S = 2.0  # the box's other processes gone before a held copy is woken


class Sessions(Protocol):
    """What checkpoints need of the session manager (``SessionManager`` is one): its sessions
    by id and its spawner, without importing the manager (which holds the checkpoints)."""

    spawner: Spawner

    def session(self, session_id: str) -> Session: ...


@dataclass
class Held:
    id: str
    pid: int  # in the sandbox
    pidfd: int
    files: int
    bytes: int
    line: SessionProcess  # the control socket and pipes it shares (the process it copied)

    def alive(self) -> bool:
        return not select.select([self.pidfd], [], [], 0)[0]


class Checkpoints:
    """Every session's checkpoints, by session id; the manager's ``checkpoints``."""

    def __init__(self, manager: Sessions) -> None:
        self.manager = manager
        self.held: dict[str, dict[str, Held]] = {}
        self.watched: dict[str, int] = {}  # session id -> pidfd of its adopted process
        self.loop = asyncio.get_running_loop()

    def count(self, session_id: str) -> int:
        return len(self.held.get(session_id, {}))

    async def take(self, session_id: str) -> Branched:
        session = self.manager.session(session_id)
        async with session.lock:
            held = self.held.setdefault(session.id, {})
            self._forget_dead(session)
            if len(held) >= MAX_CHECKPOINTS:
                raise RequestError(
                    "too_many_checkpoints",
                    f"session {session.id} holds {MAX_CHECKPOINTS} checkpoints already: drop one",
                )
            proc = session.proc
            if proc.exit is not None:
                raise RequestError("unavailable", "the session process is gone: run a cell first")
            reply = await ask(proc, {"type": "checkpoint", "waker": os.getpid()})
            if reply.get("type") != "checkpointed" or "error" in reply:
                why = str(reply.get("error", "no answer"))
                code = "budget_exceeded" if reply.get("budget") else "unavailable"
                raise RequestError(code, f"no checkpoint of session {session.id}: {why}")
            pid = procs.child_pid(proc.pid, _number(reply.get("pid")))
            if pid is None:
                raise RequestError("unavailable", "the checkpoint ended as soon as it was made")
            cp = Held(
                uuid.uuid4().hex[:16],
                pid,
                os.pidfd_open(pid),
                _number(reply.get("files")),
                _number(reply.get("bytes")),
                proc,
            )
            held[cp.id] = cp
            session.last_used = time.monotonic()
            return self._reply(session, "checkpoint", checkpoint_id=cp.id, files=cp.files,
                               bytes=cp.bytes)  # fmt: skip

    async def rollback(self, session_id: str, checkpoint_id: str, keep: bool = True) -> Branched:
        """Back to the checkpoint: its standby goes on as the session (then the copy forks the
        next standby, or with ``keep`` False ends: the checkpoint is spent). Without a standby
        (none forked yet, or the box killed it) the copy forks the process that goes on, or
        (spent) goes on itself."""
        session = self.manager.session(session_id)
        async with session.lock:
            cp = self._find(session, checkpoint_id)
            if not await self.empty_box(session, session.proc):
                raise RequestError("unavailable", "the session's processes would not end")
            proc = cp.line  # the process it was copied from, or one since replaced (``retire``)
            if session.proc is not proc:
                self.retire(session)
                session.proc = proc
            await _reattach(proc, self.loop)
            session.epoch += 1  # a call of the line left behind must not run in this one
            reply, woke = await _wake_standby(proc, cp.pid)
            if not woke:  # none, or it was dying: the copy forks (or goes on itself)
                wake(cp.pidfd, KEEP if keep else TAKE)
                reply = await ask(proc, None, watch=cp.pidfd)
            inner = _number(reply.get("pid"))
            if keep or woke:
                pid = procs.child_pid(cp.pid, inner)
            else:
                pid = cp.pid if inner and procs.innermost(cp.pid) == inner else None
            if pid is None:  # the copy is still held; the next call gets a fresh process
                proc.exit = proc.exit or {"op": "exited", "pid": proc.pid, "code": None}
                why = reply.get("error", "the held copy did not take over")
                raise RequestError("unavailable", f"rollback failed: {why}")
            if not keep:  # spent: the session's process now, or gone with its copy
                del self.held[session.id][cp.id]
                if woke:
                    _end(cp)
                else:
                    os.close(cp.pidfd)
            elif woke:
                signal.pidfd_send_signal(cp.pidfd, REFILL)
            self._adopt(session, proc, pid)
            session.last_used = time.monotonic()
            return self._reply(session, "rollback", checkpoint_id=cp.id)

    def drop(self, session_id: str, checkpoint_id: str) -> Branched:
        session = self.manager.session(session_id)
        cp = self.held.get(session.id, {}).pop(checkpoint_id, None)
        if cp is None:
            raise RequestError("no_such_checkpoint", f"no checkpoint {checkpoint_id!r} here")
        _end(cp)
        if cp.line is not session.proc and not self._holds(session.id, cp.line):
            cp.line.close(self.loop)
        return self._reply(session, "drop", checkpoint_id=checkpoint_id)

    def retire(self, session: Session) -> None:
        """The session process is being replaced: its control socket and pipes are closed,
        unless a checkpoint shares them (a rollback to it goes on over them)."""
        if not self._holds(session.id, session.proc):
            session.proc.close(self.loop)

    def _holds(self, session_id: str, line: SessionProcess) -> bool:
        return any(cp.line is line for cp in self.held.get(session_id, {}).values())

    def keep(self, session: Session) -> set[int]:
        """The pids a reset of the session's box spares: its live checkpoints, and with them
        the processes of their groups (their standbys, even one being forked now)."""
        self._forget_dead(session)
        return {cp.pid for cp in self.held.get(session.id, {}).values()}

    def forget(self, session_id: str) -> None:
        """The session ended: its checkpoints go (its box's end kills them anyway)."""
        for cp in self.held.pop(session_id, {}).values():
            _end(cp)
            cp.line.close(self.loop)
        self._unwatch(session_id)

    async def empty_box(self, session: Session, proc: SessionProcess) -> bool:
        """Kill every process of the box but its checkpoints (the session's, its children,
        daemons, commands), and wait for the session process's exit to be known."""
        keep = self.keep(session)
        proc.signal(signal.SIGKILL, group=True)
        spawner = self.manager.spawner
        for group in spawner.groups.pop(session.box.number, set()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        deadline = self.loop.time() + KILL_S
        if spawner.pool.isolation != "dirs":  # the box's uid is its own: all of it goes
            left = [proc.pid] if proc.exit is None else []  # most often the only one: no scan
            while left or (left := _alive(session.box.uid, keep)):  # one may have forked
                if self.loop.time() > deadline:
                    return False
                held = [procs.kill_held(pid, session.box.uid) for pid in left]
                dying = [fd for fd in held if fd is not None]
                try:
                    if not await all_ended(dying, deadline, self.loop):
                        return False
                finally:
                    for fd in dying:
                        os.close(fd)
                left = []
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.exited.wait(), max(deadline - self.loop.time(), 0.01))
        return proc.exit is not None

    def _find(self, session: Session, checkpoint_id: str) -> Held:
        cp = self.held.get(session.id, {}).get(checkpoint_id)
        if cp is None:
            raise RequestError("no_such_checkpoint", f"no checkpoint {checkpoint_id!r} here")
        if not cp.alive():
            self._forget_dead(session)
            raise RequestError(
                "no_such_checkpoint", f"checkpoint {checkpoint_id} was lost (its process ended)"
            )
        return cp

    def _forget_dead(self, session: Session) -> None:
        held = self.held.get(session.id, {})
        for key, cp in list(held.items()):
            if not cp.alive():
                _end(held.pop(key))
                if cp.line is not session.proc and not self._holds(session.id, cp.line):
                    cp.line.close(self.loop)

    def _adopt(self, session: Session, proc: SessionProcess, pid: int) -> None:
        """``proc`` is now ``pid``, a process no zygote reports the exit of: a pidfd does."""
        self._unwatch(session.id)
        proc.renew(pid)
        pidfd = os.pidfd_open(pid)
        self.watched[session.id] = pidfd

        def ended() -> None:
            self._unwatch(session.id)
            if proc.pid == pid and proc.exit is None:
                proc.exit = {"op": "exited", "pid": pid, "code": None}
                proc.exited.set()

        self.loop.add_reader(pidfd, ended)

    def _unwatch(self, session_id: str) -> None:
        pidfd = self.watched.pop(session_id, None)
        if pidfd is not None:
            self.loop.remove_reader(pidfd)
            os.close(pidfd)

    def _reply(self, session: Session, op: BranchOp, **fields: Any) -> Branched:
        reply: Branched = {
            "type": "branched",
            "op": op,
            "session_id": session.id,
            "epoch": session.epoch,
            "checkpoints": self.count(session.id),
        }
        reply.update(fields)  # type: ignore[typeddict-item]
        return reply


async def _wake_standby(proc: SessionProcess, copy: int) -> tuple[dict[str, Any], bool]:
    """Wake the standby of the held copy ``copy`` (it goes on as the session): its answer,
    and whether it woke: not when there was none, or it ended without answering (the box's
    code killed it as it was found)."""
    standby = _standby(copy)
    if standby is None:
        return {}, False
    try:
        wake(standby, GO)
        reply = await ask(proc, None, watch=standby)
        return reply, not ("error" in reply and select.select([standby], [], [], 0)[0])
    finally:
        os.close(standby)


def _number(field: Any) -> int:
    """A count or pid from a session process's frame: its code may have written the frame,
    so anything but a plain non-negative int is 0 (never a reply the host would refuse)."""
    return field if isinstance(field, int) and not isinstance(field, bool) and field > 0 else 0


def _end(cp: Held) -> None:
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(cp.pidfd, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.close(cp.pidfd)


def _alive(uid: int, keep: set[int]) -> list[int]:
    """Live (not zombie) processes of ``uid`` but ``keep`` and the members of their groups."""
    alive = []
    for pid in procs.uid_pids(uid):
        if pid in keep:
            continue
        seen = procs.stat(pid)
        if seen is not None and seen[0] != b"Z" and int(seen[2]) not in keep:
            alive.append(pid)
    return alive


def _standby(copy: int) -> int | None:
    """A pidfd of the held copy's standby: its child in its process group, which no other
    process can join (the group's session is the copy's), or ``None`` when it has none."""
    for kid in procs.group_children(copy):
        try:
            pidfd = os.pidfd_open(kid)
        except ProcessLookupError:
            continue
        if kid in procs.group_children(copy):  # so with the pidfd held: not a pid reused since
            return pidfd
        os.close(pidfd)
    return None


async def _reattach(proc: SessionProcess, loop: asyncio.AbstractEventLoop) -> None:
    """A fresh reader on the control socket, with what the killed process left in it
    dropped: the next frame is the held copy's."""
    proc.writer.transport.pause_reading()  # type: ignore[attr-defined]
    ctl = socket.socket(fileno=os.dup(proc.ctl.fileno()))
    proc.writer.close()  # closes its own fd only: the socket lives on in ``ctl``
    ctl.setblocking(False)
    with contextlib.suppress(BlockingIOError, ConnectionError):
        while ctl.recv(65536):
            pass
    proc.ctl = ctl
    proc.reader, proc.writer = await asyncio.open_unix_connection(sock=ctl)
    for fd in proc.fds:
        proc.drain(fd)  # its output up to its end: dropped at the next cell's start
