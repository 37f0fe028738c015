"""Boxes: every session is a box, and a box is a number (ioi/isolate's model, inside a sandbox).

From the number derive its uid and gid (``uid_base + number``) and its limits. Invariants:
- a number is held by at most one live box, and is free again only once nothing of the box is
  left (its pid 1 reaped; with ``uids``, every process and file of its uid removed);
- budgets add up: every live box's pids and disk, with the kernel's reserve, fit the sandbox's
  caps: ``take`` refuses a box that would not fit. Isolations and why: docs/design/boxes.md.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from typing import Any, Literal

from ..wire.protocol import BoxLimits
from .box_protocol import BoxInfo

Isolation = Literal["namespaces", "uids", "dirs"]
MB = 1024 * 1024
DEFAULT_PIDS = 64
DEFAULT_NOFILE = 1024
DEFAULT_DISK_MB = 128
# Processes of the sandbox no box may take: the kernel's own (supervisor, zygote, what they
# start) and each box's pid 1 (root: outside every box's RLIMIT_NPROC)
KERNEL_PIDS = 32
_MEMORY_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
_PIDS_FILES = ("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max")
_UNLIMITED = 1 << 62


class LimitsError(ValueError):
    """Requested limits the sandbox cannot give (over its caps, or not positive integers)."""


def _cgroup_value(paths: tuple[str, ...]) -> int | None:
    for path in paths:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _UNLIMITED:
            return int(text)
        return None  # "max", or a number meaning unlimited
    return None


def _hard(limit: int) -> int | None:
    hard = resource.getrlimit(limit)[1]
    return None if hard == resource.RLIM_INFINITY else hard


@dataclass(frozen=True)
class Caps:
    """What the sandbox itself allows; a box never gets more. ``None``: no cap known."""

    memory_mb: int | None
    pids: int | None
    fsize_mb: int | None
    nofile: int | None
    disk_mb: int | None = None  # the boxes' disks together (tmpfs: in the sandbox's memory)
    # The host's defaults for its boxes (the kernel's --box-* arguments): a session that asks
    # for no other limits gets these, and so can take a spare process made with them.
    preset: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of_this_sandbox(
        cls, preset: dict[str, int] | None = None, disk_mb: int | None = None
    ) -> Caps:
        """This sandbox's caps; ``preset`` limits over the built-in defaults (``LimitsError``
        when one is over a cap: a sandbox that could open no session must not start)."""
        memory = _cgroup_value(_MEMORY_FILES)
        fsize = _hard(resource.RLIMIT_FSIZE)
        if memory and disk_mb:
            if memory <= disk_mb * MB:
                raise LimitsError(
                    f"the boxes' disks ({disk_mb} MB) take all of the sandbox's memory "
                    f"({memory // MB} MB): nothing is left for their processes"
                )
            memory -= disk_mb * MB  # the boxes' disks live in it: the rest is for processes
        caps = cls(
            memory_mb=memory // MB if memory else None,
            pids=_cgroup_value(_PIDS_FILES),
            fsize_mb=fsize // MB if fsize else None,
            nofile=_hard(resource.RLIMIT_NOFILE),
            disk_mb=disk_mb,
        )
        if preset:
            caps.check(preset)
            caps = cls(**{**caps.__dict__, "preset": dict(preset)})
        return caps

    def defaults(self) -> BoxLimits:
        """A box's limits when the host names none: the host's ``preset``, and for what it
        leaves out, half the sandbox's memory, a quarter of its pids (at most
        ``DEFAULT_PIDS``), its file size, ``DEFAULT_NOFILE`` files and, where boxes
        have disks of their own, ``DEFAULT_DISK_MB`` (at most a quarter of their room)."""
        limits: BoxLimits = {
            "pids": min(DEFAULT_PIDS, max(self.pids // 4, 8)) if self.pids else DEFAULT_PIDS,
            "nofile": min(DEFAULT_NOFILE, self.nofile or DEFAULT_NOFILE),
        }
        if self.disk_mb:  # boxes with disks of their own (namespaces)
            limits["disk_mb"] = min(DEFAULT_DISK_MB, max(self.disk_mb // 4, 1))
        if self.memory_mb:
            limits["memory_mb"] = max(self.memory_mb // 2, 16)
        if self.fsize_mb:
            limits["fsize_mb"] = self.fsize_mb
        limits.update(self.preset)  # type: ignore[typeddict-item]
        return limits

    def check(self, requested: dict[str, Any] | None) -> BoxLimits:
        """The defaults overridden by ``requested``; ``LimitsError`` past a cap."""
        limits = self.defaults()
        for name, value in (requested or {}).items():
            if name not in BOX_LIMITS:
                raise LimitsError(f"unknown limit {name!r} (known: {', '.join(BOX_LIMITS)})")
            cap: int | None = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LimitsError(f"limit {name!r} must be a positive integer, not {value!r}")
            if name == "pids" and cap is not None:
                cap -= KERNEL_PIDS + 1  # a box never holds what the kernel keeps for itself
            if cap is not None and value > cap:
                raise LimitsError(f"limit {name}={value} is over this sandbox's cap of {cap}")
            limits[name] = value  # type: ignore[literal-required]
        return limits


BOX_LIMITS = ("memory_mb", "pids", "fsize_mb", "nofile", "disk_mb")


@dataclass
class Box:
    """One box: its number and everything derived from it."""

    number: int
    uid: int
    gid: int
    workspace: str
    tmp: str
    limits: BoxLimits = field(default_factory=dict)  # type: ignore[assignment]
    env: dict[str, str] = field(default_factory=dict)  # for its processes (its proxy's, say)

    def describe(self) -> BoxInfo:
        """The box as the zygote's children need it (a JSON datagram field)."""
        return {
            "number": self.number,
            "uid": self.uid,
            "gid": self.gid,
            "workspace": self.workspace,
            "tmp": self.tmp,
            "limits": self.limits.copy(),
            "env": dict(self.env),
        }


class BoxPool:
    """Numbers ``0 .. count - 1``: taken by sessions, given back once their reset is done."""

    def __init__(
        self,
        *,
        isolation: Isolation,
        workspace_root: str,
        tmp_root: str = "/tmp",
        uid_base: int = 20000,
        count: int = 256,
        caps: Caps | None = None,
    ) -> None:
        self.isolation = isolation
        self.caps = caps
        self.workspace_root = workspace_root
        self.tmp_root = tmp_root
        self.uid_base = uid_base
        self.count = count
        self.free = list(range(count))
        self.quarantined: set[int] = set()
        self.held: dict[int, BoxLimits] = {}  # number -> limits, until given back clean
        self.kept = 0  # emptied boxes kept for their number's next box (each an init's pid)

    @property
    def per_uid(self) -> bool:
        """Whether each box runs as a uid of its own."""
        return self.isolation != "dirs"

    def committed(self, name: str) -> int:
        """How much of a limit the boxes alive (or being emptied) hold together."""
        return sum(limits.get(name, 0) for limits in self.held.values())  # type: ignore[misc]

    def room(self, limits: BoxLimits) -> str | None:
        """Why a box with ``limits`` does not fit beside the boxes alive now, or ``None``."""
        held = self._held()
        left = self._left(held)
        for name, need in self._needs(limits):
            if need > left[name]:
                cap = held[name] + left[name]
                return f"the boxes alive hold {held[name]} of this sandbox's {cap} {name}"
        return None

    def fits(self, limits: BoxLimits) -> int:
        """How many boxes of ``limits`` fit beside the boxes alive (or being emptied) now: a
        free number for each, and their budgets within the caps (``room``'s arithmetic)."""
        left = self._left(self._held())
        return min([len(self.free), *(left[name] // need for name, need in self._needs(limits))])

    def capacity(self, limits: BoxLimits) -> tuple[int, str]:
        """How many boxes of ``limits`` this sandbox holds when none is alive, and the budget
        that sets it (``numbers``, ``pids`` or ``disk_mb``)."""
        left = self._left({"pids": 0, "disk_mb": 0})
        counts = [(self.count, "numbers")]
        counts += [(left[name] // need, name) for name, need in self._needs(limits)]
        return min(counts)

    @staticmethod
    def _needs(limits: BoxLimits) -> list[tuple[str, int]]:
        """What one box of ``limits`` takes of each budget that adds up (its pid 1 counts in
        the pids, beside the box's own)."""
        needs = [("pids", limits.get("pids", 0) + 1), ("disk_mb", limits.get("disk_mb", 0))]
        return [(name, need) for name, need in needs if need > 0]

    def _held(self) -> dict[str, int]:
        """What the boxes alive (or being emptied) hold, with the pid 1 of each kept box."""
        held = self.committed("pids") + len(self.held) + self.kept
        return {"pids": held, "disk_mb": self.committed("disk_mb")}

    def _left(self, held: dict[str, int]) -> dict[str, int]:
        """Each budget's room beside ``held`` (a budget without a cap: as good as unbounded)."""
        caps = self.caps
        tops = {
            "pids": caps.pids - KERNEL_PIDS if caps and caps.pids else None,
            "disk_mb": caps.disk_mb if caps else None,
        }
        return {name: (top - held[name] if top else _UNLIMITED) for name, top in tops.items()}

    def take(self, limits: BoxLimits) -> Box | None:
        """The lowest free box with ``limits``, or ``None`` when every box is in use (or its
        budgets would not fit: ``room``)."""
        if not self.free or self.room(limits) is not None:
            return None
        number = self.free.pop(0)
        self.held[number] = limits
        uid = self.uid_base + number if self.per_uid else os.getuid()
        gid = self.uid_base + number if self.per_uid else os.getgid()
        own = self.isolation == "namespaces"  # the box's own /workspace and /tmp
        return Box(
            number=number,
            uid=uid,
            gid=gid,
            workspace="/workspace" if own else os.path.join(self.workspace_root, f"box-{number}"),
            tmp="/tmp" if own else os.path.join(self.tmp_root, f"box-{number}"),
            limits=limits,
        )

    def give_back(self, box: Box, *, clean: bool) -> None:
        """Return ``box`` after its reset: reused when ``clean``, else quarantined until a
        later reset of it succeeds (its leftovers may go with a neighbour's end)."""
        self.quarantined.discard(box.number)
        if clean:
            self.held.pop(box.number, None)
            self.free.append(box.number)
            self.free.sort()
        else:
            self.quarantined.add(box.number)
