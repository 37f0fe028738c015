"""A process and everything below it, found by the parent links in ``/proc``, and killed as one
(stopped first, so nothing forks past the kill; held by pidfds, so no reused pid is signalled).

Used by the supervisor for a command's tree at its timeout and by a judge's runner in a box
for each test's program.
"""

from __future__ import annotations

import contextlib
import os
import signal

from . import procs

PF_EXITING = 0x4  # include/linux/sched.h
TREE_PASSES = 50  # at most this many looks for processes started while the tree was stopped


def _parent(pid: int) -> int | None:
    """``pid``'s parent, or ``None`` when it is gone."""
    fields = procs.stat(pid)
    return int(fields[1]) if fields is not None else None


def exiting(pid: int) -> bool:
    """Whether ``pid`` has begun to exit (or ended): the kernel's ``PF_EXITING`` task flag
    (``/proc/<pid>/stat``'s ninth field) is set first thing in ``do_exit``, before its memory
    goes and its fds (its ends of pipes) close, and stays on the zombie."""
    fields = procs.stat(pid)
    return fields is None or bool(int(fields[6]) & PF_EXITING)


def _scan() -> dict[int, list[bytes]]:
    """Every process of the sandbox now, by pid: its ``/proc/<pid>/stat`` fields after the
    command name (``procs.stat``), read once each."""
    found: dict[int, list[bytes]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := procs.stat(int(name))) is not None:
            found[int(name)] = fields
    return found


def _below(root: int, found: dict[int, list[bytes]]) -> set[int]:
    """``root`` and its descendants in ``found`` (``_scan``), by their parent links."""
    children: dict[int, list[int]] = {}
    for pid, fields in found.items():
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(pid)
    tree, stack = {root}, [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in tree:
                tree.add(child)
                stack.append(child)
    return tree


def tree(root: int) -> set[int]:
    """``root`` and its descendants now, by the parent links of every process of the sandbox."""
    return _below(root, _scan())


def tree_stats(root: int) -> list[list[bytes]]:
    """The ``/proc/<pid>/stat`` fields (``_scan``'s) of ``root`` and its descendants now, from
    one pass over ``/proc``: a judge's runner samples a test's tree with it every few ms."""
    found = _scan()
    return [found[pid] for pid in _below(root, found) if pid in found]


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
