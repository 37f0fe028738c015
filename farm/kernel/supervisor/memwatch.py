"""``MemoryWatch``: each box held to its memory budget as a whole, not only each of its processes.

While some box runs more than one process, the supervisor polls ``/proc`` and adds up each
box's anonymous and shared memory; a box over its budget loses its largest processes other
than its session process until it fits, and the running cell or command is told (``oom``).
Not with ``dirs`` isolation. Why, what counts, and what polling misses: docs/design/boxes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..boxes import procs
from ..boxes.uids import libc

log = logging.getLogger("farm.kernel")

INTERVAL_S = 0.05
IDLE_INTERVAL_S = 0.25
MEASURE_EVERY_S = 0.5  # a box's processes are measured by proportional share at most this often


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
    libc.setfsgid(uid)
    libc.setfsuid(uid)
    try:
        yield
    finally:
        libc.setfsuid(0)
        libc.setfsgid(0)


def pss_kb(pid: int) -> int | None:
    """``pid``'s proportional share of anonymous and shared memory: 0 when it is gone (or a
    zombie: it holds none), ``None`` when it may not be read (it made itself non-dumpable)."""
    try:
        return procs.kb_fields(f"/proc/{pid}/smaps_rollup", ("Pss_Anon:", "Pss_Shmem:"))
    except PermissionError:
        return None
    except (OSError, ValueError):  # gone meanwhile (a fork bomb's children come and go)
        return 0


def proportional(box: Watched, sizes: dict[int, int]) -> dict[int, int]:
    """``sizes`` (upper bounds) measured again by proportional share, where readable."""
    with reading_as(box.uid):
        shares = {pid: pss_kb(pid) for pid in sizes}
    return {pid: share if share is not None else sizes[pid] for pid, share in shares.items()}


def enforce(box: Watched, sizes: dict[int, int]) -> int:
    """Kill the box's largest processes, its session process last, until it fits its budget;
    the number killed."""
    total = sum(sizes.values())
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
        # uid -> (when, upper bound, proportional total) of the box's last proportional
        # measure: a box of many forked processes (a pool, a fork bomb) is over its budget by
        # the upper bound at every look, and measuring each process's share at every look
        # would keep the supervisor busy while those processes take the CPU.
        self.measured: dict[int, tuple[float, int, int]] = {}

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
                        self.hold(watched[uid], pids)
            self.measured = {u: m for u, m in self.measured.items() if u in watched}
        except Exception:
            log.exception("the memory watch failed a round")
        self.handle = self.loop.call_later(INTERVAL_S if busy else IDLE_INTERVAL_S, self.tick)

    def hold(self, box: Watched, pids: list[int]) -> None:
        """Hold one box to its budget: by the upper bound when that fits; else by proportional
        share, measured again only when ``MEASURE_EVERY_S`` passed or the upper bound grew by
        more than the room the last measure left."""
        sizes = {pid: procs.private_kb(pid) for pid in pids}
        upper = sum(sizes.values())
        if upper <= box.budget_kb:
            return
        now = self.loop.time()
        when, then_upper, then_total = self.measured.get(box.uid, (-MEASURE_EVERY_S, 0, 0))
        room = box.budget_kb - then_total
        if now - when < MEASURE_EVERY_S and room > 0 and upper - then_upper < room:
            return  # it fitted a moment ago and has not grown by what would fill it
        sizes = proportional(box, sizes)
        self.measured[box.uid] = (now, upper, sum(sizes.values()))
        if enforce(box, sizes):
            self.measured.pop(box.uid, None)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
