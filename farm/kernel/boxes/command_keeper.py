"""A command's keeper, in the box: the zygote's child becomes it, forks the command below it
and reaps everything the command's tree leaves to it, then ends as the command did.

A keeper is a child subreaper, so a descendant that calls ``setsid()`` or double-forks stays in
the tree the supervisor kills at a timeout (``boxes.trees.kill_tree``). Design and the
invariants of commands: docs/design/commands.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import NoReturn

from .box_protocol import StartCommand
from .uids import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl


def exec_in_box(request: StartCommand) -> None:
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


def _become(request: StartCommand) -> None:
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
