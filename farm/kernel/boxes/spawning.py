"""Start a program as another uid with ``posix_spawn`` (a ``vfork``): an interactive test's
interactor, the problem's own program (``subprocess`` forks the whole runner when it switches
uid: it cannot ``vfork`` then). The runner (root, single-threaded) sets its *real* uid and gid
to the program's for the spawn; ``POSIX_SPAWN_RESETIDS`` and the ``execve`` leave the child no
id 0 and no capability, ``no_new_privs`` inherited, no fd of the runner's but stdio and ``keep``.
Until the runner's uid is back, any process of that uid can signal it, the started program
too (a C program does, in microseconds: the runner wakes from the ``vfork`` later): callers
spawn so only when ``nobody_runs_as`` that uid, and only a problem's program, never a submission.
docs/design/judge.md, "Interactive problems".
"""

from __future__ import annotations

import os
import signal


def nobody_runs_as(uid: int) -> bool:
    """Whether no process but this one has ``uid`` as its real or effective uid (looked for
    in ``/proc``: with namespaces, the box's processes only)."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        real, effective = (int(x) for x in line.split()[1:3])
                        if uid in (real, effective):
                            return False
                        break
        except (OSError, ValueError):
            continue  # gone meanwhile
    return True


def spawn_as(
    argv: list[str],
    ids: tuple[int, int] | None,
    env: dict[str, str],
    *,
    stdin: int,
    stdout: int,
    stderr: int,
    keep: tuple[int, ...] = (),
    default_signals: bool = True,
) -> int:
    """Start ``argv`` (looked up on ``PATH`` unless it has a slash) in the runner's working
    directory, in a session of its own, as ``ids`` (uid, gid; ``None``: the runner's own),
    with no supplementary group, stdio from the given fds and ``keep`` inherited as they
    are numbered; SIGPIPE and SIGXFSZ back to their defaults unless not
    ``default_signals``. Its pid; ``OSError`` when it could not be started."""
    actions: list[tuple[int, ...]] = [
        (os.POSIX_SPAWN_DUP2, stdin, 0),
        (os.POSIX_SPAWN_DUP2, stdout, 1),
        (os.POSIX_SPAWN_DUP2, stderr, 2),
    ]
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                inheritable = os.get_inheritable(fd)
            except OSError:  # the listing's own fd, closed by now
                continue
            if inheritable:
                actions.append((os.POSIX_SPAWN_CLOSE, fd))
    defaults = (signal.SIGPIPE, signal.SIGXFSZ) if default_signals else ()
    for fd in keep:
        os.set_inheritable(fd, True)
    try:
        if ids is not None:
            os.setgroups([])
            os.setresgid(ids[1], 0, 0)
            os.setresuid(ids[0], 0, 0)
        try:
            return os.posix_spawnp(
                argv[0],
                argv,
                env,
                file_actions=actions,
                setsid=True,
                resetids=ids is not None,
                setsigdef=defaults,
            )
        finally:
            if ids is not None:
                os.setresuid(0, 0, 0)
                os.setresgid(0, 0, 0)
    finally:
        for fd in keep:
            os.set_inheritable(fd, False)
