"""A box's processes, found by its uid in ``/proc`` and signalled through pidfds.

What runs in a box is whatever runs under its uid (``boxes``): its session process, what that
started, commands, and daemons that ``setsid()`` and double-fork away from every group. The
supervisor finds them by identity, never by command line or parentage, in one pass over
``/proc`` for any number of boxes (``by_uid``): the owner of ``/proc/<pid>`` is the process's
uid, and only the few that show as root (the kernel's own, a box process that made itself
non-dumpable) have their status read. A pid is signalled only through a pidfd whose process is
checked to still be of the uid: a pid reused meanwhile by another box's process is never hit.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Collection


def status(pid: int) -> tuple[int, str] | None:
    """(real uid, state letter) of ``pid``, or ``None`` when it is gone."""
    uid, state = -1, "?"
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    state = line.split()[1]
                elif line.startswith("Uid:"):
                    uid = int(line.split()[1])
                    break
    except OSError:
        return None
    return uid, state


def by_uid(uids: Collection[int]) -> dict[int, list[int]]:
    """Pids of this sandbox for each of ``uids`` that has any (zombies included), in one pass."""
    found: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            owner = os.stat(f"/proc/{name}").st_uid
        except OSError:
            continue
        if owner == 0 and 0 not in uids:
            owner = (status(int(name)) or (-1, ""))[0]
        if owner in uids:
            found.setdefault(owner, []).append(int(name))
    return found


def uid_pids(uid: int) -> list[int]:
    """Pids of this sandbox whose real uid is ``uid``, zombies included."""
    return by_uid({uid}).get(uid, [])


def kill(pid: int, uid: int) -> bool:
    """SIGKILL ``pid`` if it is still a live process of ``uid``; whether it is still there
    (dying, or a zombie not yet reaped)."""
    pidfd = kill_held(pid, uid)
    if pidfd is None:
        return False
    os.close(pidfd)
    return True


def kill_held(pid: int, uid: int) -> int | None:
    """``kill``, keeping the pidfd (the caller closes it): it reads as ready once the process
    has ended, which is what a caller waiting for the end polls. ``None``: not a process of
    ``uid`` (gone, or its pid reused)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        seen = status(pid)
        if seen is not None and seen[0] == uid:
            if seen[1] != "Z":
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return pidfd
    except ProcessLookupError:
        pass
    os.close(pidfd)
    return None


def kill_uid(uid: int) -> int:
    """From the supervisor (CAP_KILL): SIGKILL every live process of ``uid``; the number of its
    processes still there (dying, or zombies not yet reaped)."""
    return kill_uids({uid})[uid]


def kill_uids(uids: Collection[int]) -> dict[int, int]:
    """``kill_uid`` for each of ``uids``, with one pass over ``/proc``."""
    found = by_uid(uids)
    return {uid: sum(kill(pid, uid) for pid in found.get(uid, [])) for uid in uids}


def private_kb(pid: int) -> int:
    """``pid``'s own resident memory, as the memory watch counts it: anonymous pages (its heap,
    stacks, private copies; pages it still shares with the process it was forked from count in
    full) and shared memory it maps (``MAP_SHARED`` anonymous maps, ``/dev/shm`` files, System V
    segments, memfds), 0 when it is gone."""
    try:
        return kb_fields(f"/proc/{pid}/status", ("RssAnon:", "RssShmem:"))
    except (OSError, ValueError):
        return 0


def kb_fields(path: str, names: tuple[str, ...]) -> int:
    """The sum of the ``names`` fields (``Name:  123 kB`` lines) of a ``/proc`` file; raises
    what opening or reading it raises (a process gone, one that may not be read)."""
    with open(path) as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(names))


def stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat``'s fields after the command's name (which may hold spaces and
    parentheses): state, ppid, process group, session...; ``None`` when it is gone. The one
    reader of that file here (``trees`` samples a judged test's tree with it)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    end = data.rfind(b")")
    fields = data[end + 2 :].split() if end > 0 else []
    return fields if len(fields) > 6 else None


def children(parent: int) -> list[int]:
    """Pids of ``parent``'s children (of all its threads)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return kids
    for task in tasks:
        try:
            with open(f"/proc/{parent}/task/{task}/children") as f:
                kids += [int(kid) for kid in f.read().split()]
        except OSError:
            continue
    return kids


def group_children(parent: int) -> list[int]:
    """Live children of ``parent`` in its process group (a held copy's: its standby)."""
    found = []
    for kid in children(parent):
        seen = stat(kid)
        if seen is not None and seen[0] != b"Z" and int(seen[1]) == int(seen[2]) == parent:
            found.append(kid)
    return found


def child_pid(parent: int, inner: int) -> int | None:
    """The pid here of ``parent``'s child whose pid in its own namespace is ``inner``."""
    for kid in children(parent):
        if innermost(kid) == inner:
            return kid
    return None


def innermost(pid: int) -> int | None:
    """``pid`` as its own (innermost) pid namespace numbers it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None
