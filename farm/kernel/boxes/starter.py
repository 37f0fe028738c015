"""An item's starter: a fork of the judge's runner, become the box's uid, that starts each test
with ``posix_spawn`` (a ``vfork``: no copy of the runner's page tables) and reaps it when told.

The runner keeps every id 0, so no test can signal it; a test can signal the starter (same
uid), never read or write it (not dumpable). Its answers are used only when whole: a starter
killed, stopped or failing at any step is the runner's cue to drop it and run that test again
itself (``testrun.spawn``). The runner watches each test by its pidfd as before; the starter
only reports ``wait4``'s status and usage. Why: docs/design/judge.md, "The item's starter".
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
from typing import Any

from . import exit_peaks, uids
from .box_protocol import BoxInfo

ANSWER_S = 2.0  # a starter silent this long after a request is dropped (stopped, or slow)
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)  # to their defaults in a test, as restore_signals


_live: set[int] = set()  # this process's starters: spared by the sweeps after each run


def live() -> frozenset[int]:
    """The pids of this process's starters in use."""
    return frozenset(_live)


class StarterFailed(Exception):
    """The starter did not answer whole (killed, stopped, refused): run the test without it."""


class Usage:
    """The fields of ``wait4``'s rusage that a run reads."""

    def __init__(self, utime: float, stime: float, maxrss: int) -> None:
        self.ru_utime, self.ru_stime, self.ru_maxrss = utime, stime, maxrss


class Starter:
    """The runner's end. ``start`` a test (its pid and the starter's peak resident size, which
    its ``ru_maxrss`` starts from), ``reap`` it once its pidfd said it ended, ``close``."""

    def __init__(self, box: BoxInfo) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gc.freeze()  # the runner's collections leave the pages it shares with the starter
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child, which never returns
            try:
                ours.close()
                _serve(theirs, box)
            finally:
                os._exit(0)
        theirs.close()
        _live.add(self.pid)
        self.sock = ours
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.alive = True
        self.exits: int | None = None  # its listener on its tests' exits (exit_peaks)

    def start(self, argv: list[str], stdin: int | None, out: int, err: int) -> tuple[int, int]:
        fds = [stdin if stdin is not None else self.devnull, out, err]
        answer = self._ask({"argv": argv}, fds)
        pid, hwm = answer.get("pid"), answer.get("hwm_kb")
        if not isinstance(pid, int) or not isinstance(hwm, int) or pid <= 1:
            raise self._failed()
        return pid, hwm

    def reap(self, pid: int) -> tuple[int, Usage]:
        answer = self._ask({"reap": pid})
        try:
            status = int(answer["status"])
            usage = Usage(float(answer["utime"]), float(answer["stime"]), int(answer["maxrss"]))
        except (KeyError, TypeError, ValueError):
            raise self._failed() from None
        return status, usage

    def _ask(self, request: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        if not self.alive:
            raise StarterFailed("no starter")
        try:
            data = json.dumps(request).encode()
            if fds is not None:
                socket.send_fds(self.sock, [data], fds)
            else:
                self.sock.send(data)
            ready, _, _ = select.select([self.sock], [], [], ANSWER_S)
            answer = None
            if ready:
                data, given, _, _ = socket.recv_fds(self.sock, 4096, 1)
                for fd in given:  # the listener, with the first answer
                    os.set_inheritable(fd, False)
                    exit_peaks.close(self.exits)
                    self.exits = fd
                answer = json.loads(data)
        except (OSError, ValueError):
            answer = None
        if not isinstance(answer, dict):
            raise self._failed()
        return answer

    def _failed(self) -> StarterFailed:
        """Drop the starter for good: killed and reaped, so that what it started comes back to
        the runner (a subreaper) for the sweep."""
        self.close()
        return StarterFailed("the starter did not answer")

    def close(self) -> None:
        if not self.alive:
            return
        self.alive = False
        _live.discard(self.pid)
        exit_peaks.close(self.exits)  # first: an exit_group then fails over to exit
        self.exits = None
        self.sock.close()
        os.close(self.devnull)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _serve(sock: socket.socket, box: BoxInfo) -> None:
    """In the starter: drop root, then start and reap tests until the runner hangs up."""
    gc.disable()  # a collection would write to every page it shares with the runner
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(number, signal.SIG_DFL)
    uids.prctl(uids.PR_SET_DUMPABLE, 0)  # no /proc/PID/mem, fd, environ, ptrace, core
    os.setgroups([])
    os.setresgid(box["gid"], box["gid"], box["gid"])
    os.setresuid(box["uid"], box["uid"], box["uid"])
    uids.prctl(uids.PR_SET_DUMPABLE, 0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = sock.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    env = uids.program_env(box)
    os.environ.clear()
    os.environ.update(env)  # PATH for posix_spawnp is the process's own
    listener = exit_peaks.listen()  # after the closeranges; sent with the first answer
    if listener is not None:
        os.set_inheritable(listener, False)
    while True:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        if not data:
            return
        for fd in fds:
            os.set_inheritable(fd, False)
        request = json.loads(data)
        if "argv" in request and len(fds) == 3:
            answer = _start(request["argv"], env, fds)
        elif "reap" in request:
            _, status, usage = os.wait4(int(request["reap"]), 0)
            answer = {
                "status": status,
                "utime": usage.ru_utime,
                "stime": usage.ru_stime,
                "maxrss": usage.ru_maxrss,
            }
        else:
            return
        for fd in fds:
            os.close(fd)
        if listener is not None:
            socket.send_fds(sock, [json.dumps(answer).encode()], [listener])
            os.close(listener)
            listener = None
        else:
            sock.send(json.dumps(answer).encode())


def _start(argv: list[str], env: dict[str, str], fds: list[int]) -> dict[str, Any]:
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
    try:
        pid = os.posix_spawnp(
            argv[0], argv, env, file_actions=actions, setsid=True, setsigdef=RESTORED
        )
    except OSError as exc:
        return {"error": str(exc)}
    return {"pid": pid, "hwm_kb": _peak_kb()}


def _peak_kb() -> int:
    """This process's peak resident size (``VmHWM``, kB): a test started by ``vfork`` begins
    its ``ru_maxrss`` there (``execve`` keeps the high-water mark of the image it replaced)."""
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1])
    return 0
