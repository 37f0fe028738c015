"""A box's machine: new mount, pid, network, IPC and UTS namespaces, and its private disk.

The zygote forks each box's pid 1 into a new pid namespace; the init makes the rest of the box
(``make_box``, ``init_box``) and drops CAP_SYS_ADMIN and CAP_NET_ADMIN. Invariants: nothing is
mounted in the sandbox's own namespace (``/`` is made private first); the rest of the root
stays as the sandbox has it (read-only); a box's end is its pid 1's end, which takes every
process and mount of the box with it. Why and what it costs: docs/design/boxes.md.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

from . import leftovers, seccomp, uids
from .uids import libc

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
BOX_NAMESPACES = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
_CAP_VERSION_3 = 0x20080522
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

# Directories of the kernel's that a box must not even see (the socket's: ``__main__`` names it)
HIDDEN: list[str] = []
NOT_HIDDEN = ("/", "/tmp", "/var/tmp", "/workspace", "/dev", "/dev/shm", "/proc")

# Where a box's init finds its box's POSIX queues to empty them: /dev/mqueue, or where the
# root has none, a directory only an fd of the init's reaches (``mount_queues`` sets it)
QUEUES = "/dev/mqueue"
queues_fd: int | None = None

# The box's private directories: where each lives in the box, its directory on the box's disk
# and its mode. ``/tmp`` is bound last: the disk is mounted there first, while it is set up.
STAGING = "/tmp"
PRIVATE_DIRS = (
    ("/workspace", "workspace", 0o700),
    ("/var/tmp", "var-tmp", 0o1777),
    ("/dev/shm", "shm", 0o1777),
    ("/tmp", "tmp", 0o1777),
)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def unshare(flags: int) -> None:
    _check(libc.unshare(flags), "unshare")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def loopback_up() -> None:
    """Bring ``lo`` up in this (new) network namespace: the box's own 127.0.0.1 and ::1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def drop_capabilities(*caps: int) -> None:
    """Remove ``caps`` from this process's effective, permitted and inheritable sets."""
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capget(header, data), "capget")
    for cap in caps:
        word, bit = divmod(cap, 32)
        for field in (0, 1, 2):  # effective, permitted, inheritable
            data[word * 3 + field] &= ~(1 << bit) & 0xFFFFFFFF
    _check(libc.capset(header, data), "capset")


def setns(fd: int, kind: int) -> None:
    _check(libc.setns(fd, kind), "setns")


def make_network() -> int:
    """A network namespace with only ``lo``, up, held by the returned fd. The zygote makes one
    per box number and each box of that number enters it (``make_box``): making one and
    tearing it down is the dearest part of a box, and a box's sockets all close with its
    processes, so the next box of the number finds none of them listening."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(ready_r)
            os.close(hold_w)
            unshare(CLONE_NEWNET)
            loopback_up()
            os.write(ready_w, b"1")
            code = 0
            os.read(hold_r, 1)  # until the zygote holds the namespace (then end of file)
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(hold_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("a network namespace could not be made")
        return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(hold_w)
        os.waitpid(pid, 0)


def fork_into_new_pids(own: int) -> int:
    """``fork`` a child that is pid 1 of a new pid namespace (the box's init); this process
    and its later children stay in ``own``, the namespace it is in (an fd of it)."""
    unshare(CLONE_NEWPID)  # for the next child only: undone once it is forked
    try:
        pid = os.fork()
    except OSError:
        setns(own, CLONE_NEWPID)
        raise
    if pid != 0:
        try:
            setns(own, CLONE_NEWPID)
        except OSError:  # every later child would land in the box's namespace: end here,
            os._exit(70)  # and the kernel that lost its zygote is replaced
    return pid


def make_box(uid: int, gid: int, disk_mb: int, network: int) -> None:
    """In the box's pid 1 (``fork_into_new_pids``): unshare the box's other namespaces,
    enter its network (``make_network``) and give it its disk; ``init_box`` follows. A root
    without ``/workspace`` gets no box: its session process would have no working directory."""
    if not os.path.isdir("/workspace"):  # the mount point of the box's own: never made here
        raise FileNotFoundError("the root has no /workspace to mount a box's workspace on")
    unshare(BOX_NAMESPACES & ~CLONE_NEWNET & ~CLONE_NEWPID)
    setns(network, CLONE_NEWNET)
    mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the sandbox
    options = f"size={disk_mb}m,nr_inodes={disk_mb * 256},mode=0755"  # inodes: ~4 KiB each
    mount("farm-box", STAGING, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for target, name, mode in PRIVATE_DIRS:
        path = os.path.join(STAGING, name)
        os.mkdir(path)
        os.chmod(path, mode)  # past the umask
        if target == "/workspace":
            os.chown(path, uid, gid)
    mount_queues()  # before /tmp is bound over the disk: their place may be on it
    for target, name, _ in PRIVATE_DIRS:
        if os.path.isdir(target):  # an image may lack /var/tmp: its box then has none either
            mount(os.path.join(STAGING, name), target, None, MS_BIND)
    for path in HIDDEN:  # the kernel's own directory (its socket): empty in the box
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        mount("farm-hidden", path, "tmpfs", flags, "size=4k")


def mount_queues() -> None:
    """A fresh queue filesystem for the box's IPC namespace, on ``/dev/mqueue``; where the root
    has none (a bare host), on a directory of the box's disk that ``/tmp`` is then bound over,
    kept open by the init: its processes open queues by name and need no directory, and its
    init can still empty them (``empty_box``), which keeps the next box of the number clean."""
    global queues_fd
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if os.path.isdir(QUEUES):
        mount("mqueue", QUEUES, "mqueue", flags)
        return
    hidden = os.path.join(STAGING, "queues")
    os.mkdir(hidden, 0o700)
    mount("mqueue", hidden, "mqueue", flags)
    queues_fd = os.open(hidden, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


# What Docker hides or makes read-only in its /proc, done again over the box's fresh /proc
# (a new procfs shows all of it): host-wide timers, tasks and keys hidden; sysctls read-only.
PROC_MASKED = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug")
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")


def empty_box(uid: int, gid: int) -> bool:
    """In a box's init, once every other process of the box is gone: remove what the box left
    (its files in its four directories, its POSIX queues, its System V objects, the extended
    attributes and mode of its ``/workspace``), as the box's uid, which owns all of it and so
    may remove all of it; ``True`` when nothing is left (the box may then be the next box of
    its number: a machine as fresh as a new one). A box that left nothing costs one look."""
    queues = QUEUES if queues_fd is None else f"/proc/self/fd/{queues_fd}"  # the box's /proc
    roots = [*(target for target, _, _ in PRIVATE_DIRS if os.path.isdir(target)), queues]
    roots = [root for root in roots if os.path.isdir(root)]
    with uids.acting_as(uid, gid):
        os.chmod("/workspace", 0o700)  # back to a new box's mode (the box owns it; root the rest)
        left = [os.path.join(root, name) for root in roots for name in os.listdir(root)]
        attributes = os.listxattr("/workspace")
        leftovers.remove_ipc(uid)
        if not left and not attributes:
            return True  # nothing was there, and nothing of the box runs to add any
        leftovers.remove(left)
        for name in attributes:
            os.removexattr("/workspace", name)
        return not any(os.listdir(root) for root in roots) and not os.listxattr("/workspace")


def init_box() -> None:
    """In the box's pid 1: its own ``/proc`` (only the box's processes), with Docker's masks
    and read-only paths again, then no privilege to mount or to configure networks is left."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in PROC_MASKED:
        if os.path.exists(path):
            mount("/dev/null", path, None, MS_BIND)
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(path, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    drop_capabilities(CAP_SYS_ADMIN, CAP_NET_ADMIN)


def probe(disk_mb: int = 1) -> str | None:
    """Whether boxes can have namespaces here: ``None``, or why not (an AppArmor profile that
    denies ``mount``, rootless Docker, a stricter seccomp profile, missing capabilities).
    Tried in a throwaway child, as the zygote makes a box and its init empties it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            network = make_network()
            own = os.open("/proc/self/ns/pid", os.O_RDONLY)
            init = fork_into_new_pids(own)
            if init == 0:
                try:
                    make_box(os.getuid(), os.getgid(), disk_mb, network)
                    init_box()
                    if not empty_box(os.getuid(), os.getgid()):
                        raise OSError("a box could not be emptied for the next one")
                    seccomp.install()  # what every box process needs, tried here too
                    pidfd = os.pidfd_open(os.getpid())
                    with open(f"/proc/self/fdinfo/{pidfd}") as f:
                        if "\nPid:\t1\n" not in f.read():
                            raise OSError("pidfds name no pid in /proc/self/fdinfo here")
                    os._exit(0)
                except BaseException as exc:
                    os.write(write_end, f"{exc}".encode())
                    os._exit(1)
            code = os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])
        except BaseException as exc:
            os.write(write_end, f"{exc}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        why = reader.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return None if code == 0 else why or f"the probe exited with {code}"
