"""Boxes: every session is a box, and a box is a number (ioi/isolate's model, inside a sandbox).

From the number derive everything that makes a session private: its uid and gid
(``uid_base + number``), its workspace (``<workspace root>/box-N``: the working directory and
``HOME``, mode 0700), its temporary directory (``/tmp/box-N``: ``TMPDIR``, mode 0700) and its
limits (processes per uid, memory, file size, open files). What belongs to a box is found and
removed by that identity (its uid), never by matching names or command lines.

Invariants:
- a number is held by at most one live session; it returns to the pool only after every process
  of its uid is gone and every file of its uid is removed (``reset`` reported ``ok``), so a
  process or file left by one session can never meet the next session with that uid;
- a box whose cleanup failed (a process that would not die, a file it could not remove) is not
  reused (quarantined) until a later reset of it succeeds;
- limits are within the sandbox's own caps (its cgroup's memory and pids, its hard rlimits).

``isolation="uids"`` (the docker sandbox: the kernel runs as root with CAP_SETUID/SETGID/
SETPCAP/CHOWN/KILL) switches each box to its own uid. ``"dirs"`` (the process backend, run as an
ordinary user) keeps the private directories and limits but cannot separate uids.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from typing import Any, Literal

from .protocol import BoxLimits

Isolation = Literal["uids", "dirs"]
MB = 1024 * 1024
DEFAULT_PIDS = 64
DEFAULT_NOFILE = 1024
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
    # The host's defaults for its boxes (the kernel's --box-* arguments): a session that asks
    # for no other limits gets these, and so can take a spare process made with them.
    preset: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of_this_sandbox(cls, preset: dict[str, int] | None = None) -> Caps:
        """This sandbox's caps; ``preset`` limits over the built-in defaults (``LimitsError``
        when one is over a cap: a sandbox that could open no session must not start)."""
        memory = _cgroup_value(_MEMORY_FILES)
        fsize = _hard(resource.RLIMIT_FSIZE)
        caps = cls(
            memory_mb=memory // MB if memory else None,
            pids=_cgroup_value(_PIDS_FILES),
            fsize_mb=fsize // MB if fsize else None,
            nofile=_hard(resource.RLIMIT_NOFILE),
        )
        if preset:
            caps.check(preset)
            caps = cls(**{**caps.__dict__, "preset": dict(preset)})
        return caps

    def defaults(self) -> BoxLimits:
        """A box's limits when the host names none: the host's ``preset``, and for what it
        leaves out, half the sandbox's memory, a quarter of its pids (at most
        ``DEFAULT_PIDS``), its file size, and ``DEFAULT_NOFILE`` files."""
        limits: BoxLimits = {
            "pids": min(DEFAULT_PIDS, max(self.pids // 4, 8)) if self.pids else DEFAULT_PIDS,
            "nofile": min(DEFAULT_NOFILE, self.nofile or DEFAULT_NOFILE),
        }
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
            if cap is not None and value > cap:
                raise LimitsError(f"limit {name}={value} is over this sandbox's cap of {cap}")
            limits[name] = value  # type: ignore[literal-required]
        return limits


BOX_LIMITS = ("memory_mb", "pids", "fsize_mb", "nofile")


@dataclass
class Box:
    """One box: its number and everything derived from it."""

    number: int
    uid: int
    gid: int
    workspace: str
    tmp: str
    limits: BoxLimits = field(default_factory=dict)  # type: ignore[assignment]

    def describe(self) -> dict[str, Any]:
        """The box as the zygote's children need it (a JSON datagram field)."""
        return {
            "number": self.number,
            "uid": self.uid,
            "gid": self.gid,
            "workspace": self.workspace,
            "tmp": self.tmp,
            "limits": dict(self.limits),
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
    ) -> None:
        self.isolation = isolation
        self.workspace_root = workspace_root
        self.tmp_root = tmp_root
        self.uid_base = uid_base
        self.count = count
        self.free = list(range(count))
        self.quarantined: set[int] = set()

    def take(self, limits: BoxLimits) -> Box | None:
        """The lowest free box with ``limits``, or ``None`` when every box is in use."""
        if not self.free:
            return None
        number = self.free.pop(0)
        uid = self.uid_base + number if self.isolation == "uids" else os.getuid()
        gid = self.uid_base + number if self.isolation == "uids" else os.getgid()
        return Box(
            number=number,
            uid=uid,
            gid=gid,
            workspace=os.path.join(self.workspace_root, f"box-{number}"),
            tmp=os.path.join(self.tmp_root, f"box-{number}"),
            limits=limits,
        )

    def give_back(self, box: Box, *, clean: bool) -> None:
        """Return ``box`` after its reset: reused when ``clean``, else quarantined until a
        later reset of it succeeds (its leftovers may go with a neighbour's end)."""
        self.quarantined.discard(box.number)
        if clean:
            self.free.append(box.number)
            self.free.sort()
        else:
            self.quarantined.add(box.number)
