"""A process and everything below it, found by the parent links in ``/proc``, and killed as one
(stopped first, so nothing forks past the kill; held by pidfds, so no reused pid is signalled).

Used by the supervisor for a command's tree at its timeout and by a judge's runner in a box
for each test's program.
"""

from __future__ import annotations

import contextlib
import os
import signal

PF_EXITING = 0x4  # include/linux/sched.h
TREE_PASSES = 50  # at most this many looks for processes started while the tree was stopped


def _parent(pid: int) -> int | None:
    """``pid``'s parent (``/proc/<pid>/stat``, after the command name, which may hold spaces
    and parentheses), or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def exiting(pid: int) -> bool:
    """Whether ``pid`` has begun to exit (or ended): the kernel's ``PF_EXITING`` task flag
    (``/proc/<pid>/stat``'s ninth field) is set first thing in ``do_exit``, before its memory
    goes and its fds (its ends of pipes) close, and stays on the zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return bool(int(data[data.rindex(b")") + 2 :].split()[6]) & PF_EXITING)
    except (OSError, ValueError, IndexError):
        return True


def _scan() -> dict[int, list[bytes]]:
    """Every process of the sandbox now, by pid: its ``/proc/<pid>/stat`` fields after the
    command name (which may hold spaces and parentheses), read once each."""
    found: dict[int, list[bytes]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # gone
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        end = data.rfind(b")")
        if end > 0:
            found[int(name)] = data[end + 2 :].split()
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
