"""Held copies of a session process: its checkpoints (``session.checkpoint()``).

A checkpoint is a ``fork`` of the session process between cells, in a process group of its
own, holding a copy of the box's files in its memory and every signal blocked, until the
supervisor (and only the supervisor: a signal from the box's own uid is ignored) wakes it for
a rollback. It keeps a standby ready: a child in its group (a group no other process can join:
its session is the copy's alone), which a rollback that keeps the checkpoint wakes instead
(``GO``): it puts the files back, drains the control socket and goes on as the session; then
the copy makes the next standby (``REFILL``). Without a standby the copy forks that process
itself. Design: docs/design/fork.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import warnings
from collections.abc import Mapping
from typing import Any

from ..wire.framing import send_frame
from . import state_export
from .box_files import Entry, restore, snapshot

ORDERS = frozenset({"checkpoint", "export", "import"})
SI_USER = 0  # a kill() from a process: si_pid and si_uid filled in by the kernel

children: set[int] = set()  # this process's checkpoints: reaped here once dropped
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _death_signal(sig: int) -> None:
    """The signal this process gets when its parent ends (``prctl(PR_SET_PDEATHSIG)``; 0: none)."""
    if _libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def reap() -> None:
    """Reap this process's checkpoints that were dropped (their zombies would count in the
    box's pids budget until then); never a child of the user's."""
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue
        children.discard(pid)


def handle(
    ctl: socket.socket, order: Mapping[str, Any], roots: list[str], namespace: dict[str, Any]
) -> None:
    """``checkpoint``: fork the held copy, which answers (``checkpointed``) once it holds the
    files. Returns in this process at once, or, after a rollback, in the new session process.
    ``export`` and ``import``: the state by value, for a fork (``state_export``)."""
    if order["type"] != "checkpoint":
        send_frame(ctl, state_export.answer(order, namespace, roots))
        return
    reap()
    try:
        with warnings.catch_warnings():  # a multi-threaded fork: the copy has one thread
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError as exc:
        why = "the box's pids budget is spent" if exc.errno == errno.EAGAIN else str(exc)
        send_frame(ctl, {"type": "checkpointed", "error": why, "budget": True})
        return
    if pid:
        children.add(pid)
        return
    children.clear()
    # Every signal blocked before the copy says it holds: one the box's code sends it (same
    # uid) stays pending and is judged by its sender in ``_woken``, never a default action.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        os.setsid()  # out of the session's group: a kill of the session's group spares it
        files = {root: snapshot(root) for root in roots}
    except MemoryError:
        send_frame(ctl, {"type": "checkpointed", "error": "no memory left", "budget": True})
        os._exit(1)
    except BaseException as exc:  # a held copy never returns into the session's loop
        send_frame(ctl, {"type": "checkpointed", "error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    size = sum(len(entry[4]) for entries in files.values() for entry in entries)
    count = sum(len(entries) for entries in files.values())
    send_frame(ctl, {"type": "checkpointed", "pid": os.getpid(), "files": count, "bytes": size})
    _hold(ctl, files, int(order.get("waker", 0)), old)


def _hold(
    ctl: socket.socket, files: dict[str, list[Entry]], waker: int, old: set[int | signal.Signals]
) -> None:
    """Wait for the supervisor's signal; then files back, the control socket drained, and the
    session goes on: in the standby (woken by the supervisor itself), in a child (``KEEP``,
    when there was no standby: the copy holds on, for a later rollback) or in this process
    (``TAKE``: the checkpoint is spent). A failure is said on the socket and the copy keeps
    holding (the supervisor then gives the session a fresh process). Every signal is blocked
    (since the fork); ``old`` is the session's mask, back in the process that goes on."""
    standby = _standby(ctl, files, waker, old)
    while standby >= 0:
        sig = _woken(waker, (KEEP, TAKE, REFILL))
        reap()
        if sig == REFILL:  # the standby went on as the session (or died): the next one
            standby = _standby(ctl, files, waker, old)
            continue
        if sig == TAKE:  # this process goes on: the standby has no use left
            _retire(standby)
        if _go_on(ctl, files, old, fork=sig == KEEP):
            return
        if sig == KEEP and (standby == 0 or _gone(standby)):  # it was killed meanwhile
            standby = _standby(ctl, files, waker, old)


def _retire(standby: int) -> None:
    """Before this copy goes on itself: its standby killed (a ``REFILL`` still pending is
    dropped with every other signal sent to the copy, by ``_go_on``)."""
    if standby > 0:  # its zombie is reaped with the others' (``reap``)
        with contextlib.suppress(OSError):
            os.kill(standby, signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _standby(
    ctl: socket.socket, files: dict[str, list[Entry]], waker: int, old: set[int | signal.Signals]
) -> int:
    """Fork the standby: its pid here (0 when the box has no room: a rollback then forks);
    -1 in the standby once it goes on as the session (it then returns out of ``handle``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            parent, pid = os.getpid(), os.fork()
    except OSError:
        return 0
    if pid:
        children.add(pid)
        return pid
    children.clear()
    try:
        _death_signal(signal.SIGKILL)  # a dropped checkpoint takes it along
        if os.getppid() != parent:
            os._exit(0)
        while True:
            _woken(waker, (GO,))
            if _go_on(ctl, files, old, fork=False):
                return -1
    except BaseException:  # a standby never returns into the copy's loop
        os._exit(1)


def _go_on(
    ctl: socket.socket, files: dict[str, list[Entry]], old: set[int | signal.Signals], fork: bool
) -> bool:
    """Files back, the socket drained, then the session goes on: here (``fork`` False), or in
    a child while this process holds on. True where the session goes on."""
    try:
        for root, entries in files.items():
            restore(root, entries)
        _drain(ctl)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork() if fork else 0
    except BaseException as exc:
        with contextlib.suppress(OSError):
            send_frame(ctl, {"type": "restored", "error": f"{type(exc).__name__}: {exc}"})
        return False
    if pid:
        children.add(pid)
        return False
    if fork:
        children.clear()
    if os.getpgrp() != os.getpid():  # its own group, apart from the copy's and its standby's
        os.setsid()
    _death_signal(0)  # a standby's: the session outlives its checkpoint
    while pending := signal.sigpending():  # sent to the held process, not to the session:
        signal.sigtimedwait(pending, 0)  # dropped, as a fork's child starts with none
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    send_frame(ctl, {"type": "restored", "pid": os.getpid()})
    return True


# Real-time signals: each sent is queued with its sender. Of a standard one, one at most is
# pending: the box's own, sent while the held process was stopped or not yet scheduled, would
# absorb the supervisor's, which its sender rule then drops, and the rollback would hang.
REFILL = signal.SIGRTMIN + 1  # to a copy: its standby went on (or died); fork the next
GO = signal.SIGRTMIN + 2  # to a standby: go on as the session
KEEP, TAKE = signal.SIGRTMIN + 3, signal.SIGRTMIN + 4  # to a copy: a rollback keeps it, spends it


def _woken(waker: int, signals: tuple[int, ...]) -> int:
    """The supervisor's wake-up signal: sent by another uid (root: the box's own uid can
    signal this process too) or, where all share one uid, by the supervisor's pid."""
    while True:
        info = signal.sigwaitinfo(signals)
        if info.si_code == SI_USER and (info.si_uid != os.getuid() or info.si_pid == waker):
            return info.si_signo


def _drain(ctl: socket.socket) -> None:
    """Drop what the process before it left unread (a cell it was killed in)."""
    ctl.setblocking(False)
    try:
        while ctl.recv(65536):
            pass
    except BlockingIOError:
        pass
    finally:
        ctl.setblocking(True)
