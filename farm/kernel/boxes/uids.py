"""A box's identity: entering it, and killing what runs under it as its own uid.

``enter`` is a session process's last step before user code: the box's limits, its uid and gid
with no groups and no capabilities, no way to gain any (``no_new_privs``), its directories and
environment. A zygote helper killing *as the box's uid* (``kill(-1, SIGKILL)``) reaches exactly
that uid's processes in this sandbox and nothing else. Design: docs/design/boxes.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import tempfile
import time
from collections.abc import Iterator

from ..wire.protocol import BoxLimits
from . import procs
from .box_protocol import BoxInfo

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
KILL_DEADLINE_S = 10.0
BOX_NICE = 10  # CFS weight 110 against the kernel's 1024

libc = ctypes.CDLL(None, use_errno=True)  # the kernel's one handle on libc (prctl, setfsuid)


def prctl(option: int, value: int) -> None:
    if libc.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {value}): {os.strerror(errno)}")


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


def prepare(box: BoxInfo, isolation: str) -> None:
    """Make the box's private directories (as root: mode 0700, owned by its uid); directories
    that exist already (a replaced process of a live box) are kept with what they hold."""
    if isolation == "namespaces":  # its own disk, made with the box (``namespaces``)
        return
    for path in (box["workspace"], box["tmp"]):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        if isolation == "uids":
            os.chown(path, box["uid"], box["gid"])


def empty_bounding_set() -> None:
    """Drop every capability from this process's bounding set (the zygote does it once, so
    that all its children start with none there). It keeps the capabilities it has: the
    bounding set only limits what an ``execve`` could ever give back."""
    for cap in range(_last_cap() + 1):
        with contextlib.suppress(OSError):  # a cap this kernel does not know
            prctl(PR_CAPBSET_DROP, cap)


def become(uid: int, gid: int) -> None:
    """Drop to ``uid``/``gid`` for good: no groups, no capabilities (the bounding set is empty
    since the zygote's start), no way to gain any (``no_new_privs``)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # clears the permitted, effective and ambient sets
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def set_limits(limits: BoxLimits, *, per_uid: bool) -> None:
    """The box's rlimits; ``pids`` (RLIMIT_NPROC counts every process and thread of a uid)
    only where the box has a uid of its own."""
    mb = 1024 * 1024
    wanted = {
        resource.RLIMIT_DATA: limits.get("memory_mb", 0) * mb,
        resource.RLIMIT_FSIZE: limits.get("fsize_mb", 0) * mb,
        resource.RLIMIT_NOFILE: limits.get("nofile", 0),
        resource.RLIMIT_NPROC: limits.get("pids", 0) if per_uid else 0,
        resource.RLIMIT_CORE: 0,
    }
    for limit, value in wanted.items():
        if value or limit == resource.RLIMIT_CORE:
            resource.setrlimit(limit, (value, value))


def enter(box: BoxInfo, isolation: str) -> None:
    """Turn this freshly forked process into the box's: limits, identity, directories, env,
    and a lower CPU priority than the kernel's (``BOX_NICE``: boxes that spin, a fork bomb's
    sixty processes, still leave the supervisor the CPU to answer; no box can raise it back)."""
    os.setpriority(os.PRIO_PROCESS, 0, BOX_NICE)
    set_limits(box["limits"], per_uid=isolation != "dirs")
    if isolation != "dirs":
        become(box["uid"], box["gid"])
        prctl(PR_SET_DUMPABLE, 1)  # its own /proc entries are its own (for ps, debuggers)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a uid change cleared it
    os.umask(0o077)
    os.chdir(box["workspace"])
    os.environ.update(box_env(box))
    tempfile.tempdir = None  # the zygote may have cached the shared /tmp


KERNEL_ONLY = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")  # farm's, for itself


def program_env(box: BoxInfo) -> dict[str, str]:
    """The environment of a program a judge runs (a compile, a test, an interactor, a
    checker): the sandbox's, less what farm's images set for the kernel itself (its
    ``PYTHONPATH``, unbuffered output: a judged Python program would write a syscall a line,
    which DMOJ's do not), and the box's (``box_env``)."""
    inherited = {k: v for k, v in os.environ.items() if k not in KERNEL_ONLY}
    return {**inherited, **box_env(box)}


def box_env(box: BoxInfo) -> dict[str, str]:
    """The variables that make a process's home, temporary files and caches its box's, and
    the box's own (``Box.env``)."""
    name = f"box-{box['number']}"
    return {
        "HOME": box["workspace"],
        "TMPDIR": box["tmp"],
        "PWD": box["workspace"],
        "USER": name,
        "LOGNAME": name,
        "XDG_CACHE_HOME": os.path.join(box["tmp"], ".cache"),
        "XDG_CONFIG_HOME": os.path.join(box["tmp"], ".config"),
        **(box.get("env") or {}),  # the box's own (its proxy's, with egress)
    }


def kill_all(uid: int, deadline_s: float = KILL_DEADLINE_S) -> bool:
    """As ``uid`` (after ``become``): SIGKILL every process of the uid until none is left
    (reaped, not just dead); False at the deadline (a process stuck in the kernel)."""
    assert os.getuid() == uid, "kill_all must run as the box's uid"
    deadline = time.monotonic() + deadline_s
    while True:
        os.kill(-1, signal.SIGKILL)  # every process we may signal: exactly this uid's
        if not [pid for pid in procs.uid_pids(uid) if pid != os.getpid()]:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)  # the zygote reaps them meanwhile; poll interval of the deadline


@contextlib.contextmanager
def acting_as(uid: int, gid: int) -> Iterator[None]:
    """For the block, this process reaches files and IPC objects as ``uid``/``gid`` (its
    effective ids, no supplementary groups), then as root again. The real and saved uids stay
    root's, so no process of ``uid`` can signal or trace it meanwhile. Only for a zygote
    helper: a single-threaded child whose groups need not come back."""
    os.setgroups([])
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)  # the permitted capabilities are effective again
        os.setegid(0)
