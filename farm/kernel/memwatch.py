"""``MemoryWatch``: each box held to its memory budget as a whole, not only each of its processes.

A box's processes each get ``RLIMIT_DATA`` (its ``memory_mb``), which stops one big allocation
with a ``MemoryError``; but a box may run as many processes as its pids limit allows, and each
could take that much. The sandbox's cgroup is then the only limit, and when it is reached the
kernel's OOM killer takes the largest process of all the boxes (they volunteer, ahead of the
kernel itself): a box running many mid-sized processes could get a neighbour's one large
session killed, and with it the neighbour's variables.

So the supervisor watches. Every ``INTERVAL_S`` while some box runs more than one process
(``IDLE_INTERVAL_S`` otherwise: one pass over ``/proc`` tells), it adds up the anonymous memory
of each such box's processes. A box over its budget loses its largest processes other than its
session process until it fits (the session process, and so the box's variables, stay whenever
they alone fit), and the cell or command running then is told (``oom``, with what was killed).

The first sum counts the pages forked children still share with their parent in each of them:
an upper bound. Before a box is cut its processes are measured again by their proportional
share (``Pss_Anon``, which the supervisor may read only with the box's uid as its file-system
uid), so a pool of forked workers that share most of their memory is not punished for sharing;
a process that made itself non-dumpable keeps its upper bound.

What this does not do: the watch polls, so a box that allocates faster than it looks can reach
the sandbox's limit first, and then the OOM killer chooses (among the boxes, never the kernel).
A cgroup per box would close that window; Docker does not let a container make cgroups without
CAP_SYS_ADMIN (README, Security model). With ``dirs`` isolation (one uid for all boxes) there is
no telling the boxes' processes apart, and the watch does not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import procs

log = logging.getLogger("farm.kernel")

INTERVAL_S = 0.05
IDLE_INTERVAL_S = 0.25
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Watched:
    """A box as the watch sees it: its uid, budget and session process (``session_pid``), and
    where to report what it killed (``killed(pid, kb, total_kb, budget_kb)``)."""

    uid: int
    budget_kb: int
    session_pid: int
    killed: Callable[[int, int, int, int], None]


@contextlib.contextmanager
def reading_as(uid: int) -> Iterator[None]:
    """For the block, this process opens files with ``uid`` as its file-system uid and gid (and
    nothing else changes: no process of ``uid`` may signal or trace it meanwhile)."""
    _libc.setfsgid(uid)
    _libc.setfsuid(uid)
    try:
        yield
    finally:
        _libc.setfsuid(0)
        _libc.setfsgid(0)


def pss_anon_kb(pid: int) -> int | None:
    """``pid``'s proportional share of anonymous memory (``None``: not readable, or gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss_Anon:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def overdraft(box: Watched, pids: list[int]) -> tuple[dict[int, int], int]:
    """(kB of each of the box's processes, their total), by the upper bound first and, when that
    is over the budget, by proportional share."""
    sizes = {pid: procs.anon_kb(pid) for pid in pids}
    if sum(sizes.values()) > box.budget_kb:
        with reading_as(box.uid):
            shares = {pid: pss_anon_kb(pid) for pid in pids}
        sizes = {pid: share if share is not None else sizes[pid] for pid, share in shares.items()}
    return sizes, sum(sizes.values())


def enforce(box: Watched, pids: list[int]) -> int:
    """Kill the box's largest processes, its session process last, until it fits its budget;
    the number killed."""
    sizes, total = overdraft(box, pids)
    killed = 0
    order = sorted(sizes, key=lambda pid: (pid == box.session_pid, -sizes[pid]))
    for pid in order:
        if total <= box.budget_kb:
            break
        if procs.kill(pid, box.uid):
            killed += 1
            box.killed(pid, sizes[pid], total, box.budget_kb)
            log.warning(
                "box uid %d over its %d MB: killed pid %d (%d MB of %d MB)",
                box.uid,
                box.budget_kb // 1024,
                pid,
                sizes[pid] // 1024,
                total // 1024,
            )
        total -= sizes[pid]
    return killed


class MemoryWatch:
    """Runs on the supervisor's loop; ``boxes()`` names the boxes to hold to their budgets."""

    def __init__(self, boxes: Callable[[], list[Watched]]) -> None:
        self.boxes = boxes
        self.loop = asyncio.get_running_loop()
        self.handle: asyncio.TimerHandle | None = self.loop.call_later(IDLE_INTERVAL_S, self.tick)

    def tick(self) -> None:
        """One look at every box; the next comes sooner while some box runs several
        processes. A failure is logged, never the end of the watch."""
        busy = False
        try:
            watched = {box.uid: box for box in self.boxes()}
            if watched:
                for uid, pids in procs.by_uid(watched).items():
                    if len(pids) > 1:
                        busy = True
                        enforce(watched[uid], pids)
        except Exception:
            log.exception("the memory watch failed a round")
        self.handle = self.loop.call_later(INTERVAL_S if busy else IDLE_INTERVAL_S, self.tick)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
