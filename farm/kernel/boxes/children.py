"""What the zygote's forked children do first: become a session process, a command (or a
judge's runner), or a helper that resets a box with ``uids``.

Each runs in a fresh child of a zygote and never returns into it (``os._exit``, whatever
happens). A box process installs the box's seccomp filter while still root and untraceable,
before it takes the box's uid, never after (``_filter`` says which boxes go without one).
Design: docs/design/boxes.md.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import sys
from typing import Any, NoReturn

from ..repl import session_loop
from . import box_protocol, command_keeper, judge_runner, leftovers, seccomp, uids
from .uids import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl

# Above any fd a process here may hold: the hard nofile limit (where close_range is missing or
# refused by a seccomp profile, Python closes one fd at a time up to it).
_HARD_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
MAX_FD = 1 << 20 if _HARD_NOFILE in (resource.RLIM_INFINITY, -1) else min(_HARD_NOFILE, 1 << 20)


def prepare() -> None:
    """In the zygote, before it forks: build what each child would otherwise build after its
    fork, writing pages it then copies: the seccomp filter and the C functions it calls
    through ``ctypes`` (a ``CDLL`` makes each function object on its first use)."""
    seccomp.prepare()
    if session_loop._LIBC is not None:
        session_loop._LIBC.fflush  # noqa: B018 (cached on the CDLL by this first look-up)


def close_other_fds(keep: set[int]) -> None:
    """Close every fd but ``keep``: a ``closerange`` per gap (Linux's close_range, one system
    call each, where Python has it), since a fresh child must stay cheap."""
    low = 3
    for fd in sorted(fd for fd in keep if fd >= low):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, MAX_FD)


def session_child(
    ctl: socket.socket, out_w: int, err_w: int, request: box_protocol.Spawn, isolation: str
) -> NoReturn:
    code = 0
    try:
        config = request["session"]
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        close_other_fds({0, 1, 2, ctl.fileno()})
        session_loop.prepare_process()  # its own process group, stdio, OOM preference: as root
        box = config.get("box")
        if box is not None:
            _filter(isolation)  # before the box's uid: never a moment without it
            uids.prepare(box, isolation)
            uids.enter(box, isolation)
        session_loop.serve(ctl, config)
    except BaseException as exc:  # a session process never returns into the zygote
        with contextlib.suppress(Exception):
            print(f"farm: the session process could not start: {exc!r}", file=sys.stderr)
        code = 70
    finally:
        os._exit(code)


def command_child(
    request: box_protocol.StartCommand, stdin: int, out_w: int, err_w: int, isolation: str
) -> NoReturn:
    """Become the command: stdin is the pipe the supervisor feeds, or a staged file of the box
    opened *as the box* (so it can name only what the box may read)."""
    code = 126
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.setsid()  # its own group: a timeout kills the whole tree
        for target, fd in ((0, stdin), (1, out_w), (2, err_w)):
            os.dup2(fd, target)
        close_other_fds({0, 1, 2})
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        _filter(isolation)  # before the box's uid: never a moment without it
        if (judge := request.get("judge")) is not None:  # the judge's runner: root in the box
            prctl(PR_SET_CHILD_SUBREAPER, 1)
            code = judge_runner.serve(judge, request["box"], isolation)
        else:
            uids.enter(request["box"], isolation)
            command_keeper.exec_in_box(request)  # returns only when the command could not be run
    except BaseException as exc:  # a command never returns into the zygote
        with contextlib.suppress(Exception):
            os.write(2, f"farm: {exc}\n".encode())
    finally:
        os._exit(code)


def _filter(isolation: str) -> None:
    """The box's seccomp filter, installed while this process is still root and untraceable
    by any box (then it becomes the box's uid and dumpable). Uid boxes on a machine it knows no
    system call numbers for go without, as before namespaces; boxes with namespaces never do
    (the kernel's start probe checks it)."""
    if isolation == "namespaces" or (isolation == "uids" and seccomp.supported()):
        seccomp.install()


def fork_helper(run: Any) -> int:
    """Fork a helper that runs ``run()`` and exits with its truth (0) or falsehood (1)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            code = 0 if run() else 1
        except BaseException:  # a helper never returns into the zygote
            code = 1
        finally:
            os._exit(code)
    return pid


def reset_helper(box: box_protocol.BoxInfo, isolation: str, pgid: int | None, remove: bool) -> bool:
    """A helper's work: kill what the box runs; for a box that ends, remove what it left,
    then look again: ``False`` (the box is never reused) while a file of its uid remains."""
    if isolation == "uids":

        def kill() -> bool:
            uids.become(box["uid"], box["gid"])
            return uids.kill_all(box["uid"])

        killer = fork_helper(kill)
        _, status = os.waitpid(killer, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            return False
        if not remove:
            return True
        own = (box["workspace"], box["tmp"])  # emptied here, removed by the zygote
        roots = leftovers.box_roots(box)
        left = [path for path in leftovers.owned_entries(box["uid"], roots) if path not in own]
        # As the box (its processes are all gone: nothing of its uid can signal this one).
        with uids.acting_as(box["uid"], box["gid"]):
            leftovers.remove(left, keep_roots=own)
            leftovers.remove_ipc(box["uid"])
        return not [path for path in leftovers.owned_entries(box["uid"], roots) if path not in own]
    if pgid is not None:  # one uid for all: only the session's own process group can go
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    if remove:
        leftovers.remove((), keep_roots=(box["workspace"], box["tmp"]))
    return True
