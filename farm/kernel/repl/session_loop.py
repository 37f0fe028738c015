"""The loop inside one session process.

Forked from the zygote (which never saw the kernel token); output is captured at the
file-descriptor level by the supervisor and survives the process dying. One exec request at a
time on the control socket; SIGINT interrupts user code only while a cell runs. ``Channel``
carries ``display`` frames ahead of ``cell_done``: writers serialised, never torn by SIGINT,
none from forked children or outside a cell. Design: docs/design/kernel.md.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import io
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, cast, overload

from .. import KIND_USER
from ..tools import fileops
from ..tools.agent_tools import DEFAULT_LIMIT, AgentTools
from ..wire.framing import recv_frame, send_frame
from ..wire.protocol import CellError
from ..wire.session_frames import Ack, CallAnswer, CallFrame, CellDone, DisplayFrame, Order, Ready
from . import held_copies, hostcall_stubs, namespace_snapshot
from .cell_exec import Repl
from .render import bundle, framed

STDOUT_SPARE = 1001  # copies of the capture pipes, to restore fds 1/2 if user code closes them
STDERR_SPARE = 1002
OOM_SCORE_ADJ = 800  # the OOM killer picks a session before the supervisor (which stays at 0)


try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None)
except OSError:
    _LIBC = None


class _Interrupts:
    """Turn SIGINT into KeyboardInterrupt only while user code runs."""

    running = False

    def handler(self, signum: int, frame: object) -> None:
        if self.running:
            raise KeyboardInterrupt


def _stream(fd: int) -> io.TextIOWrapper:
    # The BufferedWriter matters: a raw FileIO may write a pipe only partially, and a
    # TextIOWrapper over it would drop the rest. Line buffering keeps output flowing.
    return io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(fd, "w", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


def _restore_stdio() -> None:
    """Point fds 1/2 and ``sys.stdout/stderr`` back at the capture pipes before each cell."""
    for fd, spare in ((1, STDOUT_SPARE), (2, STDERR_SPARE)):
        with contextlib.suppress(OSError):
            os.dup2(spare, fd)
    if getattr(sys.stdout, "closed", True):
        sys.stdout = _stream(1)
    if getattr(sys.stderr, "closed", True):
        sys.stderr = _stream(2)


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # user code may have replaced the stream
            stream.flush()
    if _LIBC is not None:
        _LIBC.fflush(None)  # C-level printf buffers


def prepare_process() -> None:
    """Set up this freshly forked process: own group, stdio, signals, OOM preference."""
    os.setsid()
    for spare, fd in ((STDOUT_SPARE, 1), (STDERR_SPARE, 2)):
        os.dup2(fd, spare, inheritable=False)
    sys.stdout = _stream(1)
    sys.stderr = _stream(2)
    try:  # os.open, not open(): a file object's layers cost a fresh child page faults
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, str(OOM_SCORE_ADJ).encode())
        finally:
            os.close(fd)
    except OSError:
        pass
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)


class Channel:
    """The session's side of the control socket: one cell reply, and frames sent before it."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.open = False  # a cell is running: frames other than the reply may be sent

    @overload
    def request(self, frame: CallFrame) -> CallAnswer | None: ...

    @overload
    def request(self, frame: DisplayFrame) -> Ack | None: ...

    def request(self, frame: CallFrame | DisplayFrame) -> CallAnswer | Ack | None:
        """Send a frame of the running cell and wait for the supervisor's answer to it
        (``None`` when no frame may be sent now). Waiting keeps the order exact: the
        supervisor reads the capture pipes up to this point before it answers."""
        if os.getpid() != self.pid:
            return None
        with self.lock:
            if not self.open:
                return None
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:  # an interrupt now would tear the frame or orphan its answer
                send_frame(self.ctl, frame)
                answer = recv_frame(self.ctl)  # the supervisor's, its only peer
                return cast("CallAnswer | Ack | None", answer)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def reply(self, frame: CellDone) -> None:
        with self.lock:
            self.open = False
            send_frame(self.ctl, frame)

    def display(self, *objs: Any) -> None:
        """``display(obj, ...)``: show each object's MIME bundle in the live stream."""
        for obj in objs:
            _flush_all()  # what was printed before comes first
            value = framed(bundle(obj))
            if self.request({"type": "display", "value": value}) is None:
                print(value["text"])


def _usage() -> tuple[float, int]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    return cpu, own.ru_maxrss


def serve(ctl: socket.socket, config: Mapping[str, Any]) -> None:
    """Answer exec requests until the supervisor closes the control socket; the first frame
    says the process is in its box and ready. ``config``: ``box_protocol.SessionConfig``
    (``boxes`` is above this package, so it is read as a mapping)."""
    workspace = AgentTools(config["box"]["workspace"], config.get("tool_limit", DEFAULT_LIMIT))
    namespace_snapshot.ROOT = str(workspace.root)
    extra = workspace.globals() if config.get("tools", True) else {}
    repl = Repl(extra)
    channel = Channel(ctl)
    builtins.display = channel.display  # type: ignore[attr-defined]
    interrupts = _Interrupts()
    signal.signal(signal.SIGINT, interrupts.handler)
    me = os.getpid()
    roots = [config["box"]["workspace"], config["box"]["tmp"]]  # the box's files
    ready: Ready = {"type": "ready"}
    send_frame(ctl, ready)
    while True:
        request = cast("Order | None", recv_frame(ctl))  # the supervisor's, its only peer
        if request is None:
            return
        held_copies.reap()  # dropped checkpoints: their pids are the box's again
        if request["type"] == "file":  # between cells, as the box's uid
            send_frame(ctl, fileops.handle(workspace, request))
            continue
        if request["type"] in held_copies.ORDERS:  # returns here in a new process after a
            held_copies.handle(
                ctl, request, roots, repl.namespace
            )  # rollback: the session's, from then on
            me = channel.pid = os.getpid()
            continue
        _restore_stdio()
        if request.get("calls"):
            hostcall_stubs.install(repl.namespace, channel, request["calls"])
        cpu0, _ = _usage()
        t0 = time.perf_counter()
        channel.open = True
        interrupts.running = True
        try:
            value, error = repl.run_cell(request["code"])
        except KeyboardInterrupt:  # arrived between user code and the return
            interrupted: CellError = {
                "ename": "KeyboardInterrupt",
                "evalue": "",
                "traceback": [],
                "kind": KIND_USER,  # the supervisor's interrupt says timeout or output_limit
            }
            value, error = None, interrupted
        finally:
            interrupts.running = False
        if os.getpid() != me:
            # A child that user code forked (``os.fork()``, a fork bomb) came back here with a
            # copy of this loop and of the control socket: it must never answer for the
            # session, or the supervisor would read its reply as the session's.
            _flush_all()
            os._exit(0)
        if value is not None:
            value = framed(value)
        _flush_all()
        cpu1, rss = _usage()
        reply: CellDone = {
            "type": "cell_done",
            "value": value,
            "error": error,
            "duration_s": time.perf_counter() - t0,
            "cpu_s": cpu1 - cpu0,
            "max_rss_kb": rss,
        }
        channel.reply(reply)
