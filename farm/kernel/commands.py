"""Commands in a box: any program of the image (``node``, ``gcc``, ``sh -c ...``), beside the
Python REPL, each in a process of its own.

A command is forked by the zygote into the session's box (its uid, limits and workspace, like
the session process) in a process group of its own, and ``execve``s its argv directly (a
string command is ``/bin/sh -c`` in the client). It never waits for the REPL: commands of one
session run concurrently with each other and with its cells. The supervisor (``CommandRun``)
feeds its stdin (bytes sent with the request, or a file staged in the box, opened as the box),
captures stdout and stderr separately with the same head+tail caps as cells, and enforces the
timeout by killing the command's whole process tree.

The tree, not only the group: a descendant that calls ``setsid()`` leaves the group, and one
that double-forks (its parent exits) would be re-parented to the zygote, out of reach of a walk
down ``/proc``'s parent links. So the zygote's child does not ``execve`` the command itself: it
becomes its *keeper*, a child subreaper that forks the command, reaps whatever is re-parented
to it, and exits with the command's own status (dying of the same signal) as soon as the
command ends. While the command runs, every process it started is therefore below the keeper,
whatever it did to its group or session; at the timeout ``kill_tree`` stops that tree (a
stopped process cannot fork), gathers it again until nothing new appears, and kills it all.
It costs one fork per command and, at a timeout, a few reads of ``/proc``; the box's other
processes (its session process, its other commands) are never in the tree.

Invariants:
- the result says what happened: ``returncode`` is the exit status, or 128 + N for a death by
  signal N (``signal`` says N), as shells report it; ``timed_out`` when the timeout killed it;
  a program that cannot be run is 127 (not found) or 126 (not executable, bad cwd), with the
  reason on stderr;
- a command that ends normally leaves its background children running (they end with the box);
  their hold on the output pipes is not waited for beyond ``DRAIN_S``;
- a timeout kills only the command's tree: each process is signalled through a pidfd taken
  once its parent link was read again, so a pid reused by a process outside the tree is never
  signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any, NoReturn

from .output import CappedBuffer, drain_into
from .uids import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl

DRAIN_S = 0.2  # after the command exits, how long output still held by its children is read
KILL_WAIT_S = 5.0
TREE_PASSES = 50  # at most this many looks for processes started while the tree was stopped


def exec_in_box(request: dict[str, Any]) -> None:
    """In the zygote's child, already in the box: become the command's keeper and start the
    command below it (returns only in the command's process, when the command could not be
    run, having written why to stderr; the caller exits with ``os._exit(code)``)."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    command = os.fork()
    if command != 0:
        _keep(command)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # it ends with its keeper (forks clear this)
    _become(request)


def _keep(command: int) -> NoReturn:
    """The keeper: reap the command and every orphan of its tree (re-parented here, the
    nearest subreaper), then end as the command did, at once: its background children, if
    any, go on below the zygote, as they would have without a keeper."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the pipes are the command's: their end is its end
        os.dup2(devnull, fd)
    os.close(devnull)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # cannot happen while the command is a child
            os._exit(70)
        if pid == command:
            break
    if os.WIFSIGNALED(status):
        died = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(died, signal.SIG_DFL)
            os.kill(os.getpid(), died)
        os._exit(128 + died)  # a signal that does not kill (none killed the command, then)
    os._exit(os.waitstatus_to_exitcode(status))


def _become(request: dict[str, Any]) -> None:
    """Become the command: stdin, cwd, env, ``execve`` (returns only on failure)."""
    argv: list[str] = request["argv"]
    staged = request.get("stdin_path")
    if staged:  # relative to the workspace (the cwd here), as the box: only what it may read
        fd = os.open(staged, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(staged)
    cwd = request.get("cwd")
    if cwd:
        try:
            os.chdir(os.path.join(os.getcwd(), cwd))
        except OSError as exc:
            os.write(2, f"farm: cannot change to cwd {cwd!r}: {exc.strerror}\n".encode())
            os._exit(126)
    os.environ.update(request.get("env") or {})
    try:
        os.execvpe(argv[0], argv, os.environ)
    except FileNotFoundError:
        os.write(2, f"farm: {argv[0]}: command not found\n".encode())
        os._exit(127)
    except OSError as exc:  # not executable, argv/env past Linux's limits (E2BIG), ...
        os.write(2, f"farm: {argv[0]}: {exc.strerror}\n".encode())
        os._exit(126)


def _parent(pid: int) -> int | None:
    """``pid``'s parent (``/proc/<pid>/stat``, after the command name, which may hold spaces
    and parentheses), or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def tree(root: int) -> set[int]:
    """``root`` and its descendants now, by the parent links of every process of the sandbox."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = _parent(int(name))
            if parent is not None:
                children.setdefault(parent, []).append(int(name))
    tree, stack = {root}, [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in tree:
                tree.add(child)
                stack.append(child)
    return tree


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and every process below it. The tree is stopped first (SIGSTOP: a
    stopped process cannot fork) and gathered again until a pass finds no process it had not
    stopped, so a child forked meanwhile is caught too; then all of it is killed. Each process
    is held by a pidfd and kept only if its parent is still in the tree once the pidfd holds
    it: a pid reused by a process elsewhere is never signalled."""
    held: dict[int, int] = {}
    try:
        for _ in range(TREE_PASSES):
            members = tree(root)
            new = [pid for pid in members if pid not in held]
            if not new:
                break
            for pid in new:
                try:
                    pidfd = os.pidfd_open(pid)
                except OSError:  # gone
                    continue
                if pid != root and _parent(pid) not in members:
                    os.close(pidfd)
                    continue
                held[pid] = pidfd
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
        for pidfd in held.values():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        for pidfd in held.values():
            os.close(pidfd)


class CommandRun:
    """One running command, as the supervisor sees it (``exit``/``exited`` like a session
    process: the zygote reports its death)."""

    def __init__(self, pid: int, stdin_fd: int, out_fd: int, err_fd: int, cap: int) -> None:
        self.pid = pid
        self.stdin_fd = stdin_fd
        self.fds = {out_fd: CappedBuffer(cap), err_fd: CappedBuffer(cap)}
        self.out, self.err = self.fds[out_fd], self.fds[err_fd]
        self.exit: dict[str, Any] | None = None
        self.exited = asyncio.Event()
        self.open = set(self.fds)

    async def run(self, stdin: bytes, timeout_s: float) -> dict[str, Any]:
        """Feed ``stdin``, wait for the exit (killing the tree at the timeout), read what
        it wrote; the fields of a ``CommandResult``."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        for fd in self.fds:
            os.set_blocking(fd, False)
            loop.add_reader(fd, self._drain, fd)
        feeding = asyncio.ensure_future(self._feed(stdin))
        timed_out = False
        try:
            await asyncio.wait_for(self.exited.wait(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            kill_tree(self.pid)  # its keeper and everything below it, setsid() or not
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.exited.wait(), KILL_WAIT_S)
        finally:
            feeding.cancel()
        deadline = loop.time() + DRAIN_S
        while self.open and loop.time() < deadline:
            await asyncio.sleep(0.01)  # pipes still open: children may hold them; bounded
        self.close()
        died = (self.exit or {}).get("signal")
        code = (self.exit or {}).get("code")
        return {
            "returncode": 128 + died if died else code,
            "signal": died,
            "timed_out": timed_out,
            "stdout": self.out.text(),
            "stderr": self.err.text(),
            "stdout_truncated": self.out.truncated,
            "stderr_truncated": self.err.truncated,
            "duration_s": time.perf_counter() - t0,
        }

    async def _feed(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin without blocking the loop, then close it (a
        command that exits without reading it all gets the rest dropped)."""
        loop = asyncio.get_running_loop()
        fd = self.stdin_fd
        try:
            os.set_blocking(fd, False)
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(fd, view[: 1 << 16]) :]
                except BlockingIOError:
                    ready = loop.create_future()
                    loop.add_writer(fd, ready.set_result, None)
                    try:
                        await ready
                    finally:
                        loop.remove_writer(fd)
        except (BrokenPipeError, OSError):
            pass  # it stopped reading
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _drain(self, fd: int) -> None:
        if not drain_into(fd, self.fds[fd]):
            asyncio.get_running_loop().remove_reader(fd)
            self.open.discard(fd)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for fd in self.fds:
            if fd in self.open:
                loop.remove_reader(fd)
                self.open.discard(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
