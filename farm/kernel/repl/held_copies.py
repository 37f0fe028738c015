"""Held copies of a session process: its checkpoints (``session.checkpoint()``).

A checkpoint is a ``fork`` of the session process between cells, in a process group of its
own, holding a copy of the box's files in its memory and every signal blocked, until the
supervisor (and only the supervisor: a signal from the box's own uid is ignored) wakes it for
a rollback. Woken, it puts the files back, forks the process that goes on as the session
(the checkpoint stays held, for a later rollback) and drains the control socket, which it
shares with the session. Design: docs/design/fork.md.
"""

from __future__ import annotations

import contextlib
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
    session goes on: in a child (``KEEP``: the copy holds on, for a later rollback) or in
    this process (``TAKE``: the checkpoint is spent). A failure is said on the socket and the
    copy keeps holding (the supervisor then gives the session a fresh process). Every signal
    is blocked (since the fork); ``old`` is the session's mask, back in the process that goes
    on."""
    while True:
        keep = _woken(waker) == KEEP
        reap()
        try:
            for root, entries in files.items():
                restore(root, entries)
            _drain(ctl)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork() if keep else 0
        except BaseException as exc:
            with contextlib.suppress(OSError):
                send_frame(ctl, {"type": "restored", "error": f"{type(exc).__name__}: {exc}"})
            continue
        if pid == 0:
            if keep:
                children.clear()
                os.setsid()
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            send_frame(ctl, {"type": "restored", "pid": os.getpid()})
            return
        children.add(pid)


KEEP, TAKE = signal.SIGUSR2, signal.SIGUSR1  # a rollback that keeps the checkpoint, or spends it


def _woken(waker: int) -> int:
    """The supervisor's wake-up signal: sent by another uid (root: the box's own uid can
    signal this process too) or, where all share one uid, by the supervisor's pid."""
    while True:
        info = signal.sigwaitinfo({KEEP, TAKE})
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
