"""A box's identity: entering it, killing what runs under it, cleaning up after it.

``enter`` is a session process's last step before user code (in a freshly forked child of the
zygote: a uid change applies to the whole process). A box's end is normally the supervisor's
alone: ``procs.kill_uid`` (CAP_KILL, through pidfds) and ``nothing_left``, then root removes
the two empty directories. When that does not finish (a process stuck in the kernel) or the box left
files, a zygote helper does it with no more privilege than each step needs:

- killing runs *as the box's uid*: ``kill(-1, SIGKILL)`` then reaches exactly the processes of
  that uid in this sandbox (daemons that ``setsid()`` and double-fork included) and nothing else;
  ``/proc`` tells when none is left;
- finding what a box left runs as root (the shared directories are not listable by boxes),
  without following links, and not only at the top of the shared directories: a box may write
  into a directory another box opened to others (``/tmp/x`` made 0777, a workspace made 0777
  or 0733), and a file of its uid left there would meet the next session with that uid. The
  search (``find_owned``) descends into every directory that others may enter (``o+x``) and
  that is not the box's own (those go whole); a directory root may not read (``o-r``: root has
  no CAP_DAC_READ_SEARCH) is read by the helper *as its owner* (effective uid only);
- removing runs as the box's uid again (its effective uid: what the box could delete, and a link
  it planted cannot make the cleanup delete more), then the search runs again: a file of the uid
  still there (under a directory of another box's that the box's uid cannot empty) keeps the
  box's number out of use for good.

What it costs: boxes' umask is 077, so their directories are closed (0700) unless a box opens
one, and the search then looks at the top of each shared directory and at no more; the
supervisor's own check stops after ``FAST_SEARCH_MAX`` entries and leaves the rest to a helper.
Left out, by design: a directory that even its owner may not read (``0311``), and a file another
box *moved* into a directory of its own that is closed to root: root cannot list those without
CAP_DAC_READ_SEARCH, which the kernel does not hold.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
IPC_RMID = 0
KILL_DEADLINE_S = 10.0
EMPTY_TMPFS_DIR = 40  # tmpfs reports 20 bytes a directory entry, "." and ".." included
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue")
FAST_SEARCH_MAX = 1024  # entries the supervisor looks at before it leaves a box to a helper
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SYSVIPC = {"shm": ("shmctl", 7), "msg": ("msgctl", 7), "sem": ("semctl", 4)}  # table: uid column

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {value}): {os.strerror(errno)}")


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


def prepare(box: dict[str, Any], isolation: str) -> None:
    """Make the box's private directories (as root: mode 0700, owned by its uid); directories
    that exist already (a replaced process of a live box) are kept with what they hold."""
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


def set_limits(limits: dict[str, int], *, per_uid: bool) -> None:
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


def enter(box: dict[str, Any], isolation: str) -> None:
    """Turn this freshly forked process into the box's: limits, identity, directories, env."""
    set_limits(box["limits"], per_uid=isolation == "uids")
    if isolation == "uids":
        become(box["uid"], box["gid"])
        prctl(PR_SET_DUMPABLE, 1)  # its own /proc entries are its own (for ps, debuggers)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a uid change cleared it
    os.umask(0o077)
    os.chdir(box["workspace"])
    name = f"box-{box['number']}"
    os.environ.update(
        HOME=box["workspace"],
        TMPDIR=box["tmp"],
        PWD=box["workspace"],
        USER=name,
        LOGNAME=name,
        XDG_CACHE_HOME=os.path.join(box["tmp"], ".cache"),
        XDG_CONFIG_HOME=os.path.join(box["tmp"], ".config"),
    )
    tempfile.tempdir = None  # the zygote may have cached the shared /tmp


def box_roots(box: dict[str, Any]) -> tuple[str, ...]:
    """Where a box may have left files: the shared directories and the roots of the boxes'
    workspaces and temporary directories (another box may have opened its own to others)."""
    roots = [*SHARED_DIRS, os.path.dirname(box["workspace"]), os.path.dirname(box["tmp"])]
    return tuple(dict.fromkeys(roots))


def nothing_left(box: dict[str, Any], isolation: str, roots: Iterable[str] | None = None) -> bool:
    """Whether a box whose processes are all gone left nothing to remove but its two empty
    directories (which root may remove itself): the common case, which needs no helper. Its
    cost is bounded (``FAST_SEARCH_MAX``): "don't know" is ``False``, and a helper looks."""
    for path in (box["workspace"], box["tmp"]):
        try:
            if os.listdir(path):  # the box's own uid, or dirs isolation
                return False
        except PermissionError:  # root without DAC override: a tmpfs dir's size says it
            if os.stat(path).st_size > EMPTY_TMPFS_DIR:
                return False
        except FileNotFoundError:
            continue
    if isolation == "dirs":
        return True
    own = {box["workspace"], box["tmp"]}  # /tmp/box-N is the box's uid's, and always there
    found = find_owned(box["uid"], box_roots(box) if roots is None else roots, FAST_SEARCH_MAX)
    if not found.complete or found.unread or any(path not in own for path in found.paths):
        return False
    return not any(_ipc_rows(box["uid"]))


def _uid_processes(uid: int) -> list[int]:
    """Pids in this sandbox whose real uid is ``uid``, zombies included (they still count)."""
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(int(name))
                        break
        except OSError:  # gone meanwhile
            continue
    return found


def kill_all(uid: int, deadline_s: float = KILL_DEADLINE_S) -> bool:
    """As ``uid`` (after ``become``): SIGKILL every process of the uid until none is left
    (reaped, not just dead); False at the deadline (a process stuck in the kernel)."""
    assert os.getuid() == uid, "kill_all must run as the box's uid"
    deadline = time.monotonic() + deadline_s
    while True:
        os.kill(-1, signal.SIGKILL)  # every process we may signal: exactly this uid's
        if not _uid_processes(uid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)  # the zygote reaps them meanwhile; poll interval of the deadline


class Found(NamedTuple):
    """What ``find_owned`` saw: the uid's entries (each to be removed whole), the directories
    others may enter that it could not read (path, owner), and whether it looked everywhere
    (``False``: it stopped at its limit, or a directory was replaced while it looked)."""

    paths: list[str]
    unread: list[tuple[str, int]]
    complete: bool


def find_owned(uid: int, roots: Iterable[str], limit: int | None = None) -> Found:
    """The entries of ``uid`` under ``roots`` (boxes cannot list the shared directories: run
    as root, or as a directory's owner), without following links: a directory is entered
    through a descriptor opened with ``O_NOFOLLOW`` and checked to be the one its listing
    showed. It descends into the directories of other uids that others may enter (``o+x``): a
    box can have written only there, outside its own entries, which go whole."""
    paths: list[str] = []
    unread: list[tuple[str, int]] = []
    pending: list[tuple[str, tuple[int, int] | None, int]] = [(r, None, 0) for r in roots]
    seen = 0
    while pending:
        directory, identity, owner = pending.pop()
        try:
            listing = _listing(directory, identity)
        except PermissionError:
            unread.append((directory, owner))
            continue
        except OSError:  # gone, or not a directory (a root that this sandbox has not)
            continue
        if listing is None:
            return Found(paths, unread, False)
        for name, st in listing:
            seen += 1
            if limit is not None and seen > limit:
                return Found(paths, unread, False)
            path = os.path.join(directory, name)
            if st.st_uid == uid:
                paths.append(path)
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IXOTH:
                pending.append((path, (st.st_dev, st.st_ino), st.st_uid))
    return Found(paths, unread, True)


def _listing(directory: str, identity: tuple[int, int] | None) -> list[tuple[str, Any]] | None:
    """(name, lstat) of each entry of ``directory``; ``None`` when it is no longer the
    directory ``identity`` names (replaced, by a link or anything else, since it was seen)."""
    fd = os.open(directory, _DIR_FLAGS)
    try:
        if identity is not None:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != identity:
                return None
        entries = []
        with os.scandir(fd) as it:
            for entry in it:
                with contextlib.suppress(OSError):  # gone meanwhile
                    entries.append((entry.name, entry.stat(follow_symlinks=False)))
        return entries
    finally:
        os.close(fd)


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


def owned_entries(uid: int, roots: Iterable[str] = SHARED_DIRS) -> list[str]:
    """Every entry of ``uid`` under ``roots`` that can be found (a helper's search, as root,
    unbounded): each directory root may not read is read as its owner, in turn."""
    found = find_owned(uid, roots)
    paths = list(found.paths)
    unread, tried = list(found.unread), set()
    while unread:
        directory, owner = unread.pop()
        if directory in tried or owner in (0, uid):  # root's own, or going whole
            continue
        tried.add(directory)
        with acting_as(owner, owner):  # a box's gid is its uid
            more = find_owned(uid, [directory])
        paths += more.paths
        unread += more.unread
    return paths


def _writable(function: Any, path: str, exc: Any) -> None:
    """``rmtree``'s error hook: a directory the box made unwritable is opened up and retried."""
    parent = os.path.dirname(path)
    with contextlib.suppress(OSError):
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, stat.S_IRWXU)
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


def remove(paths: Iterable[str], keep_roots: Iterable[str] = ()) -> None:
    """As the box's uid: remove ``paths`` whole, and the contents of ``keep_roots`` (the box's
    own directories, which root removes once empty)."""
    targets = list(paths)
    for root in keep_roots:
        with contextlib.suppress(OSError):
            os.chmod(root, stat.S_IRWXU)
            targets += [os.path.join(root, name) for name in os.listdir(root)]
    for path in targets:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, onerror=_writable)  # onexc: 3.12+ only
            else:
                os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError:
            _writable(os.unlink, path, OSError())


def _ipc_rows(uid: int) -> Iterator[tuple[str, int]]:
    """(table, id) of the System V objects ``uid`` owns or made."""
    for table, (_, uid_column) in _SYSVIPC.items():
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if int(row[uid_column]) == uid or int(row[uid_column + 2]) == uid:  # owner, creator
                yield table, int(row[1])


def remove_ipc(uid: int) -> None:
    """As the box's uid: remove the System V shared memory, queues and semaphores it made
    (they outlive processes, like files)."""
    for table, ipc_id in list(_ipc_rows(uid)):
        function = getattr(_libc, _SYSVIPC[table][0])
        if table == "sem":
            function(ipc_id, 0, IPC_RMID)
        else:
            function(ipc_id, IPC_RMID, None)
