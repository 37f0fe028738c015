"""A test's peak memory, read as it exits: a seccomp listener on ``exit_group``.

``wait4``'s ``ru_maxrss`` starts at the high-water mark of the image an ``execve`` replaced
(the starter's, ~10 MB), and a sample every 10 ms misses a program that ends before it, so a
C program read 0 to 1.4 MB at random and a Python one 4 kB to 8 MB. Here the starter adds a
filter that turns each ``exit_group`` of what it starts into a notification, and the runner,
holding the listener, reads the caller's ``VmHWM`` (its own image's peak, exact) before it
lets the call go on. Only the caller's time is spent; a program that dies by a signal keeps
the sampled peak. With the listener closed the call fails with ``ENOSYS`` and libc's
``_exit`` ends the thread with ``exit`` instead, so nothing hangs on a runner gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import platform
import select
import struct

from .seccomp import JEQ_K, LD_W_ABS, RET_K, SECCOMP_RET_ALLOW, SockFprog, op
from .uids import libc

SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
USER_NOTIF = 0x7FC00000  # SECCOMP_RET_USER_NOTIF
SPAWN_FAILED = 127
CONTINUE = 1  # SECCOMP_USER_NOTIF_FLAG_CONTINUE: the call runs as if never stopped
NOTIF_RECV, NOTIF_SEND, NOTIF_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
NOTIF_SIZE = 80  # struct seccomp_notif: id, pid, flags, then seccomp_data (64 bytes)

# audit arch, seccomp(2)'s number, exit_group's number
NUMBERS = {"x86_64": (0xC000003E, 317, 231), "aarch64": (0xC00000B7, 277, 94)}


def program(machine: str | None = None) -> bytes:
    """The filter: ``exit_group`` of this arch becomes a notification, all else goes on; but
    ``exit_group(127)``, how a ``posix_spawn`` child whose ``execve`` failed ends (glibc's and
    musl's ``SPAWN_ERROR``) while its parent, the starter, waits: nobody could answer then."""
    arch, _, exit_group = NUMBERS[machine or platform.machine()]
    allow = SECCOMP_RET_ALLOW
    ops = [op(LD_W_ABS, 4), op(JEQ_K, arch, 1, 0), op(RET_K, allow), op(LD_W_ABS, 0)]
    ops += [op(JEQ_K, exit_group, 0, 4), op(LD_W_ABS, 16)]  # its status, the low word
    ops += [op(JEQ_K, SPAWN_FAILED, 0, 1), op(RET_K, allow), op(RET_K, USER_NOTIF)]
    return b"".join(ops + [op(RET_K, allow)])


def listen() -> int | None:
    """Add the filter to this process (so to all it starts) and return its listener, or
    ``None`` where that cannot be (another arch, no ``no_new_privs``, an old kernel)."""
    machine = platform.machine()
    if machine not in NUMBERS:
        return None
    code = program(machine)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = SockFprog(len(code) // 8, ctypes.addressof(buffer))
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER
    fd = libc.syscall(NUMBERS[machine][1], SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(fprog))
    return fd if fd >= 0 else None


def answer(listener: int) -> tuple[int, int] | None:
    """Answer one notification on ``listener`` (let the call go on) and return the caller's
    process id and peak resident size (kB), or ``None`` when the caller was gone first."""
    notif = bytearray(NOTIF_SIZE)
    try:
        fcntl.ioctl(listener, NOTIF_RECV, notif, True)
    except OSError:  # the caller was killed while it waited
        return None
    notif_id, tid = struct.unpack_from("=QI", notif)
    seen = _status(tid)
    with contextlib.suppress(OSError):  # the caller was killed meanwhile: its pid is stale
        fcntl.ioctl(listener, NOTIF_ID_VALID, struct.pack("=Q", notif_id))
        fcntl.ioctl(listener, NOTIF_SEND, struct.pack("=QqiI", notif_id, 0, 0, CONTINUE))
        return seen
    return None


def answer_waiting(listener: int, pid: int) -> int | None:
    """Answer every notification waiting on ``listener`` now and return the peak (kB) of
    ``pid``'s own ``exit_group`` if it was among them (the exits of what ``pid`` started
    are let go unread), else ``None``."""
    peak = None
    while select.select([listener], [], [], 0)[0]:
        seen = answer(listener)
        if seen is None:  # its caller gone first (or nobody left to call): look again later
            break
        if seen[0] == pid:
            peak = max(peak or 0, seen[1])
    return peak


def _status(tid: int) -> tuple[int, int] | None:
    """The process id (``Tgid``) and ``VmHWM`` (kB) of thread ``tid``, from its status."""
    tgid = hwm = None
    try:
        with open(f"/proc/{tid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                elif line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        return None
    return (tgid, hwm) if tgid is not None and hwm is not None else None


def close(listener: int | None) -> None:
    if listener is not None:
        with contextlib.suppress(OSError):
            os.close(listener)
