"""A box's seccomp filter: the system calls that could undo its namespaces are refused.

With CAP_SYS_ADMIN in the container, Docker's seccomp profile lets every process call
``unshare``, ``mount`` and ``setns``; a box holds no capability, but the kernel's attack
surface behind those calls (and ``bpf``, ``perf_event_open``, ``userfaultfd``, io_uring,
keyrings) stays closed to it anyway. ``install`` adds the filter to the calling process (after
``no_new_privs``), and every process it starts inherits it; nothing can remove it. Refused
calls fail with ``EPERM``; ``clone3`` with ``ENOSYS`` (its flags are in memory a filter cannot
read), so that libc falls back to ``clone``, whose namespace flags are checked. Standard
library only: the BPF program is built here (``linux/filter.h``), once, before the zygote forks.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from .uids import PR_SET_NO_NEW_PRIVS, libc, prctl

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
LD_W_ABS, JEQ_K, JSET_K, JGE_K, RET_K = 0x20, 0x15, 0x45, 0x35, 0x06

# clone's namespace flags (CLONE_NEWNS ... CLONE_NEWNET, CLONE_NEWCGROUP, CLONE_NEWTIME)
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000
CLONE_NAMESPACES |= 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

# audit arch, and the numbers of the refused calls, then of clone and clone3 (checked apart);
# x32 calls (x86-64 numbers with bit 30 set) are refused whole
# Calls numbered alike on every architecture (the unified table, from 403 on)
_UNIFIED = dict(
    io_uring_setup=425, io_uring_enter=426, io_uring_register=427, open_tree=428,
    move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
    open_tree_attr=467, clone3=435,
)  # fmt: skip
ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        dict(
            _UNIFIED, unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, bpf=321,
            perf_event_open=298, keyctl=250, add_key=248, request_key=249, userfaultfd=323,
            clone=56,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            _UNIFIED, unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, bpf=280,
            perf_event_open=241, keyctl=219, add_key=217, request_key=218, userfaultfd=282,
            clone=220,
        ),
    ),
}  # fmt: skip
_X32_BIT = 0x40000000


def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (this one's by default), as ``sock_filter`` structs."""
    arch, numbers = ARCHES[machine or platform.machine()]
    deny, nosys = SECCOMP_RET_ERRNO | errno.EPERM, SECCOMP_RET_ERRNO | errno.ENOSYS
    ops = [op(LD_W_ABS, 4), op(JEQ_K, arch, 1, 0), op(RET_K, deny), op(LD_W_ABS, 0)]
    if arch == ARCHES["x86_64"][0]:
        ops += [op(JGE_K, _X32_BIT, 0, 1), op(RET_K, deny)]
    for name, number in numbers.items():
        if name not in ("clone", "clone3"):
            ops += [op(JEQ_K, number, 0, 1), op(RET_K, deny)]
    ops += [op(JEQ_K, numbers["clone3"], 0, 1), op(RET_K, nosys)]
    # clone: its flags are the first argument (the low word of args[0], at offset 16)
    ops += [op(JEQ_K, numbers["clone"], 0, 3), op(LD_W_ABS, 16)]
    ops += [op(JSET_K, CLONE_NAMESPACES, 0, 1), op(RET_K, deny)]
    ops += [op(RET_K, SECCOMP_RET_ALLOW)]
    return b"".join(ops)


def supported() -> bool:
    """Whether this machine's system call numbers are known here (x86-64, aarch64)."""
    return platform.machine() in ARCHES


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_built: tuple[ctypes.Array[ctypes.c_char], SockFprog] | None = None


def _prepared() -> SockFprog:
    """This machine's filter as ``prctl`` takes it, built once per process that asks (the
    kernel at start, before the zygote forks: each box process then only installs it)."""
    global _built
    if _built is None:
        code = program()
        buffer = ctypes.create_string_buffer(code, len(code))
        _built = (buffer, SockFprog(len(code) // 8, ctypes.addressof(buffer)))
    return _built[1]


def prepare() -> None:
    """Build the filter now, where it is supported: in the zygote before it forks boxes."""
    if supported():
        _prepared()


def install() -> None:
    """Add the box's filter to this process (and so to all it starts); raises when it cannot:
    a box must never run without it."""
    fprog = _prepared()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    result = libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {os.strerror(err)}")
