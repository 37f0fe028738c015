"""The zygote: a single-threaded fork server that makes boxes and spawns processes in them.

Forked from the kernel *before* the token is read, so no session process ever has the token in
its memory; a new process is a ``fork()``, not an interpreter start. It keeps the kernel's
identity (root), which no box can signal or trace, and does every privileged step in a child of
its own (``children``), never in itself. Each zygote (a box's pid 1 is one too) reaps every child
and orphan it gets and reports exits (``box_protocol``). Design: docs/design/boxes.md.
"""

from __future__ import annotations

import contextlib
import gc
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from . import box_protocol, children, egress, namespaces, uids
from .box_protocol import read_request
from .box_protocol import send as _send
from .pool import DEFAULT_DISK_MB
from .uids import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl


class Zygote:
    """The zygote's state: which helper answers which request."""

    def __init__(self, sock: socket.socket, isolation: str, *, in_box: bool = False) -> None:
        self.sock = sock
        self.isolation = isolation
        self.in_box = in_box  # a box's pid 1: each process it spawns is sent with a pidfd
        self.helpers: dict[int, box_protocol.Reset] = {}  # helper pid -> the request it serves
        self.networks: dict[int, int] = {}  # box number -> its network namespace (an fd)
        self.own_pids = -1  # the sandbox's pid namespace (an fd), where children go back to

    def _spawned(self, pid: int, fds: list[int]) -> None:
        pidfd = os.pidfd_open(pid) if self.in_box else None
        try:
            _send(self.sock, {"op": "spawned", "pid": pid}, fds if pidfd is None else [*fds, pidfd])
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def box(self, request: box_protocol.MakeBox) -> None:
        """Make a box: its pid 1 is forked straight into a new pid namespace (the zygote's own
        children land in the sandbox's again right after), makes the rest of the box
        (``namespaces.make_box``) and becomes the box's zygote; the answer carries its pid and
        the supervisor's end of its connection, or why the box could not be made."""
        box = request["box"]
        if box["number"] not in self.networks:
            self.networks[box["number"]] = namespaces.make_network()
        network = self.networks[box["number"]]
        theirs, ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_end, write_end = os.pipe()
        try:
            init = namespaces.fork_into_new_pids(self.own_pids)
        except OSError:
            for closing in (theirs, ours):
                closing.close()
            for fd in (read_end, write_end):
                os.close(fd)
            raise
        if init == 0:
            try:
                os.setsid()  # a group of its own: never the kernel's, which a box could name
                self.sock.close()
                theirs.close()
                os.close(read_end)
                disk_mb = box["limits"].get("disk_mb", DEFAULT_DISK_MB)
                namespaces.make_box(box["uid"], box["gid"], disk_mb, network)
                namespaces.init_box()
                os.write(write_end, b"ok")
            except BaseException as exc:  # a box's init never returns into the zygote
                with contextlib.suppress(Exception):
                    os.write(write_end, f"{exc}".encode())
                os._exit(1)
            os.close(write_end)
            _serve(Zygote(ours, self.isolation, in_box=True))
        ours.close()
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:
            answer = reader.read().decode(errors="replace")
        try:
            if answer == "ok":
                _send(self.sock, {"op": "spawned", "pid": init}, [theirs.fileno()])
            else:
                os.waitpid(init, 0)  # it exited: reaped here, never reported
                why = answer or "the box's init died while making the box"
                _send(self.sock, {"op": "spawned", "pid": -1, "error": why})
        finally:
            theirs.close()

    def listen(self, request: box_protocol.Listen) -> None:
        """In a box's pid 1: the box's proxy endpoint (``egress.listen``), sent with its port
        (the supervisor hands it to the host's proxy; no copy stays here)."""
        answer: box_protocol.Listening = {"op": "listening", "id": request["id"]}
        try:
            endpoint = egress.listen()
        except OSError as exc:
            answer["error"] = str(exc)
            _send(self.sock, answer)
            return
        answer["port"] = endpoint.getsockname()[1]
        try:
            _send(self.sock, answer, [endpoint.fileno()])
        finally:
            endpoint.close()

    def recycle(self, request: box_protocol.Recycle) -> None:
        """In a box's pid 1, as the box ends: every other process killed and reaped, then what
        the box left removed (``namespaces.empty_box``); ``reset_done`` says whether the box is
        as fresh as a new one (else the supervisor ends it)."""
        box = request["box"]
        deadline = time.monotonic() + uids.KILL_DEADLINE_S
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        while self.reap() and time.monotonic() < deadline:
            time.sleep(0.001)  # poll interval of the deadline: they are dying
        ok = not self.reap()
        if ok:
            try:
                ok = namespaces.empty_box(box["uid"], box["gid"])
            except OSError:
                ok = False
        _send(self.sock, {"op": "reset_done", "id": request["id"], "ok": ok})

    def empty(self, request: box_protocol.Reset) -> None:
        """In a box's pid 1: kill every other process of the box and reap them all (their
        exits reported), then ``reset_done``; not ok when one would not go in time."""
        deadline = time.monotonic() + uids.KILL_DEADLINE_S
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)  # from a pid namespace's init: all of it but itself
        while self.reap() and time.monotonic() < deadline:
            time.sleep(0.001)  # poll interval of the deadline: they are dying
        _send(self.sock, {"op": "reset_done", "id": request["id"], "ok": not self.reap()})

    def spawn(self, request: box_protocol.Spawn) -> None:
        ctl_parent, ctl_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            self.sock.close()
            ctl_parent.close()
            os.close(out_r)
            os.close(err_r)
            children.session_child(ctl_child, out_w, err_w, request, self.isolation)
        ctl_child.close()
        os.close(out_w)
        os.close(err_w)
        try:
            self._spawned(pid, [ctl_parent.fileno(), out_r, err_r])
        finally:
            ctl_parent.close()
            os.close(out_r)
            os.close(err_r)

    def command(self, request: box_protocol.StartCommand) -> None:
        """A command in a box (``commands.py``): its own process group, the box's identity,
        stdin from a file of the box (or nothing), stdout/stderr to pipes sent back as fds."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            self.sock.close()
            for fd in (out_r, err_r, in_w):
                os.close(fd)
            children.command_child(request, in_r, out_w, err_w, self.isolation)
        for fd in (out_w, err_w, in_r):
            os.close(fd)
        try:
            self._spawned(pid, [in_w, out_r, err_r])
        finally:
            for fd in (in_w, out_r, err_r):
                os.close(fd)

    def reset(self, request: box_protocol.Reset) -> None:
        box, remove = request["box"], bool(request.get("remove"))
        pgid = request.get("pgid")
        pid = children.fork_helper(lambda: children.reset_helper(box, self.isolation, pgid, remove))
        self.helpers[pid] = request

    def reap(self) -> bool:
        """Reap what has exited, reporting each; whether any child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            request = self.helpers.pop(pid, None)
            if request is not None:
                self._reset_done(request, os.waitstatus_to_exitcode(status) == 0)
            elif os.WIFSIGNALED(status):
                _send(self.sock, {"op": "exited", "pid": pid, "signal": os.WTERMSIG(status)})
            else:
                code = os.waitstatus_to_exitcode(status)
                _send(self.sock, {"op": "exited", "pid": pid, "code": code})

    def _reset_done(self, request: box_protocol.Reset, ok: bool) -> None:
        box = request["box"]
        if ok and request.get("remove"):
            for path in (box["workspace"], box["tmp"]):  # emptied by the helper, as the box
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    pass
                except OSError:
                    ok = False  # something survived: the box is not reused
        _send(self.sock, {"op": "reset_done", "id": request["id"], "ok": ok})


def run(sock: socket.socket, isolation: str) -> NoReturn:
    """Serve requests until the supervisor goes away."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    if isolation != "dirs":
        uids.empty_bounding_set()
    children.prepare()  # built once here, not after each fork (the seccomp filter)
    zygote = Zygote(sock, isolation)
    if isolation == "namespaces":
        zygote.own_pids = os.open("/proc/self/ns/pid", os.O_RDONLY)
    _serve(zygote)


def _serve(zygote: Zygote) -> NoReturn:
    sock = zygote.sock
    kept = {0, 1, 2, sock.fileno(), zygote.own_pids}
    if namespaces.queues_fd is not None:  # a box's init, where the root has no /dev/mqueue
        kept.add(namespaces.queues_fd)
    children.close_other_fds(kept)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # Everything imported so far is shared with every child: keep the collector off it, or its
    # first pass in a child writes to every page (copy-on-write) and slows the first cell.
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    # Each handler takes the request of its op (``box_protocol``); others are not this zygote's.
    handlers: dict[str, Callable[[Any], None]] = {"spawn": zygote.spawn, "command": zygote.command}
    if zygote.in_box:
        handlers.update(reset=zygote.empty, recycle=zygote.recycle, listen=zygote.listen)
    else:
        handlers.update(reset=zygote.reset, box=zygote.box)
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                zygote.reap()
                continue
            try:
                message = read_request(sock)
            except box_protocol.UnreadableRequest:
                continue
            if message is None:
                os._exit(0)
            handler = handlers.get(str(message.get("op")))
            if handler is None:
                continue
            try:
                handler(message)
            except OSError as exc:  # fork failed (no pids left): the supervisor must hear it
                _send(sock, box_protocol.refusal(message, str(exc)))
        sys.stdout.flush()


def start(isolation: str) -> tuple[int, socket.socket]:
    """Fork the zygote; return its pid and the supervisor's end of the control pair."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        parent.close()
        try:
            run(child, isolation)
        finally:
            os._exit(1)
    child.close()
    return pid, parent
