"""The zygote: a single-threaded fork server that spawns session processes.

It is forked from the kernel *before* the token is read, so no session process ever has the
token in its memory. It has already imported the kernel and common stdlib modules, so a new
session is a ``fork()`` (milliseconds), not an interpreter start. It is a child subreaper: it
reaps every session and every orphan they leave, and reports each session's exit status to
the supervisor. Supervisor <-> zygote messages are JSON datagrams on a SOCK_SEQPACKET pair; a
spawn answer carries the new session's control socket and stdout/stderr pipes as fds.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any, NoReturn

from . import session

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> bool:
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _close_other_fds(keep: set[int]) -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds or [])


def _session_child(ctl: socket.socket, out_w: int, err_w: int, config: dict[str, Any]) -> NoReturn:
    code = 0
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        _close_other_fds({0, 1, 2, ctl.fileno()})
        session.prepare_process()
        session.serve(ctl, config)
    except BaseException:
        code = 70
    finally:
        os._exit(code)


def _spawn(sock: socket.socket, config: dict[str, Any]) -> None:
    ctl_parent, ctl_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        sock.close()
        ctl_parent.close()
        os.close(out_r)
        os.close(err_r)
        _session_child(ctl_child, out_w, err_w, config)
    ctl_child.close()
    os.close(out_w)
    os.close(err_w)
    try:
        _send(sock, {"op": "spawned", "pid": pid}, [ctl_parent.fileno(), out_r, err_r])
    finally:
        ctl_parent.close()
        os.close(out_r)
        os.close(err_r)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if os.WIFSIGNALED(status):
            _send(sock, {"op": "exited", "pid": pid, "signal": os.WTERMSIG(status)})
        else:
            _send(sock, {"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def run(sock: socket.socket) -> NoReturn:
    """Serve spawn requests until the supervisor goes away."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    _close_other_fds({0, 1, 2, sock.fileno()})
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(sock)
                continue
            data = sock.recv(4096)
            if not data:
                os._exit(0)
            message = json.loads(data)
            if message.get("op") == "spawn":
                _spawn(sock, message.get("session", {}))
        sys.stdout.flush()


def start() -> tuple[int, socket.socket]:
    """Fork the zygote; return its pid and the supervisor's end of the control pair."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        parent.close()
        try:
            run(child)
        finally:
            os._exit(1)
    child.close()
    return pid, parent
