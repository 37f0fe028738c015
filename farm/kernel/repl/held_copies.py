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
import stat
import warnings
from collections.abc import Mapping
from typing import Any

from ..wire.framing import send_frame

ORDERS = frozenset({"checkpoint"})
SI_USER = 0  # a kill() from a process: si_pid and si_uid filled in by the kernel
Entry = tuple[str, str, int, int, bytes]  # relative path, kind (d, f, l), mode, mtime_ns, data

children: set[int] = set()  # this process's checkpoints: reaped here once dropped


def reap() -> None:
    """Reap this process's checkpoints that were dropped (their zombies would count in the
    box's pids budget until then); never a child of the user's."""
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue
        children.discard(pid)


def handle(ctl: socket.socket, order: Mapping[str, Any], roots: list[str]) -> None:
    """``checkpoint``: fork the held copy, which answers (``checkpointed``) once it holds the
    files. Returns in this process at once, or, after a rollback, in the new session process."""
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
    _hold(ctl, files, int(order.get("waker", 0)))


def _hold(ctl: socket.socket, files: dict[str, list[Entry]], waker: int) -> None:
    """Wait for the supervisor's SIGUSR2; then files back, the control socket drained, and a
    child that returns to the loop as the session. A failure is said on the socket and the
    copy keeps holding (the supervisor then gives the session a fresh process)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    while True:
        _woken(waker)
        reap()
        try:
            for root, entries in files.items():
                restore(root, entries)
            _drain(ctl)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except BaseException as exc:
            with contextlib.suppress(OSError):
                send_frame(ctl, {"type": "restored", "error": f"{type(exc).__name__}: {exc}"})
            continue
        if pid == 0:
            children.clear()
            os.setsid()
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            send_frame(ctl, {"type": "restored", "pid": os.getpid()})
            return
        children.add(pid)


def _woken(waker: int) -> None:
    """Until a SIGUSR2 from the supervisor: sent by another uid (root: the box's own uid can
    signal this process too) or, where all share one uid, by the supervisor's pid."""
    while True:
        info = signal.sigwaitinfo({signal.SIGUSR2})
        if info.si_code == SI_USER and (info.si_uid != os.getuid() or info.si_pid == waker):
            return


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


def snapshot(root: str) -> list[Entry]:
    """Every directory, regular file and symbolic link under ``root`` (itself first), top
    down; sockets, fifos and devices are not kept."""
    entries: list[Entry] = []

    def walk(rel: str) -> None:
        path = os.path.join(root, rel) if rel else root
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            entries.append((rel, "d", stat.S_IMODE(info.st_mode), info.st_mtime_ns, b""))
            for name in sorted(os.listdir(path)):
                walk(os.path.join(rel, name))
        elif stat.S_ISREG(info.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read()
            entries.append((rel, "f", stat.S_IMODE(info.st_mode), info.st_mtime_ns, data))
        elif stat.S_ISLNK(info.st_mode):
            target = os.readlink(path).encode("utf-8", "surrogateescape")
            entries.append((rel, "l", 0, info.st_mtime_ns, target))

    if os.path.isdir(root):
        walk("")
    return entries


def restore(root: str, entries: list[Entry]) -> None:
    """Make ``root`` hold exactly ``entries`` again. A file still there is rewritten in place
    (a file the session holds open stays the same file); what is not in ``entries`` goes."""
    wanted = {rel: kind for rel, kind, *_ in entries}
    _prune(root, "", wanted)
    for rel, kind, mode, _, data in entries:
        path = os.path.join(root, rel) if rel else root
        if kind == "d":
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            with contextlib.suppress(PermissionError):  # a root the box does not own (/tmp)
                os.chmod(path, mode | stat.S_IRWXU)  # its own mode once it is filled, below
        elif kind == "f":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(path, mode)
        elif kind == "l":
            target = data.decode("utf-8", "surrogateescape")
            if not os.path.islink(path) or os.readlink(path) != target:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                os.symlink(target, path)
    for rel, kind, mode, mtime_ns, _ in reversed(entries):  # directories after what they hold
        path = os.path.join(root, rel) if rel else root
        with contextlib.suppress(OSError):
            if kind == "d":
                os.chmod(path, mode)
            os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)


def _prune(root: str, rel: str, wanted: dict[str, str]) -> None:
    path = os.path.join(root, rel) if rel else root
    with contextlib.suppress(PermissionError):  # a directory made read-only is emptied too
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)
    for name in os.listdir(path):
        child = os.path.join(rel, name)
        full = os.path.join(root, child)
        info = os.lstat(full)
        kind = "d" if stat.S_ISDIR(info.st_mode) else "f" if stat.S_ISREG(info.st_mode) else "l"
        if not stat.S_ISLNK(info.st_mode) and kind == "l":
            kind = "?"  # a socket, fifo or device: never kept
        if wanted.get(child) != kind:
            _remove(full, info)
        elif kind == "d":
            _prune(root, child, wanted)


def _remove(path: str, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        os.chmod(path, stat.S_IRWXU)
        for name in os.listdir(path):
            child = os.path.join(path, name)
            _remove(child, os.lstat(child))
        os.rmdir(path)
    else:
        os.unlink(path)
